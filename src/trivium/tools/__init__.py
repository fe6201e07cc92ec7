"""Tools for agents: JSON-schema descriptions, the tool-call text format, and built-in tools."""

from trivium.tools.builtin import TOOLS, calculate, get_tools, register_tool
from trivium.tools.calls import Tool, ToolCall, ToolCallParse, format_tool_call, parse_tool_calls, run_tool

__all__ = [
    "TOOLS",
    "Tool",
    "ToolCall",
    "ToolCallParse",
    "calculate",
    "format_tool_call",
    "get_tools",
    "parse_tool_calls",
    "register_tool",
    "run_tool",
]
