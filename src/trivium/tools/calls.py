"""Tools described by JSON schema, and the tool-call text format the model writes.

Format (the Hermes / Qwen2.5 convention, which the chat templates of those model families also render):
a model turn may contain any number of blocks

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37 * 48"}}
    </tool_call>

Text outside the blocks is the turn's ``content``. A turn without a block is a final answer. A block whose
body is not a JSON object with a string ``name`` and an object ``arguments`` is reported as a parse error
(the ReAct workflow feeds the error back to the model as a tool message; the endpoint returns the text as
content), never silently dropped. ``arguments`` may also be a JSON string holding an object (what OpenAI
clients send back in ``tool_calls``).

Results go back as messages with role ``tool``; chat templates render them (the tiny template as a user
turn wrapping ``<tool_response>...</tool_response>``, like Qwen2.5).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Tool",
    "ToolCall",
    "ToolCallParse",
    "format_tool_call",
    "parse_tool_calls",
]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class Tool:
    """A function the model may call: ``name``, a description and a JSON schema of its arguments.

    ``fn(**arguments) -> str`` runs it (None for tools only described, e.g. to the endpoint). An exception
    in ``fn`` becomes an error message to the model, not a crash of the episode.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments object
    fn: Callable[..., Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name or ""):
            raise ValueError(f"Tool name {self.name!r} must be 1-64 characters of [A-Za-z0-9_.-]")
        if self.parameters.get("type") != "object":
            raise ValueError(f"Tool {self.name!r}: parameters must be a JSON schema with type 'object'")

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (what ``apply_chat_template(tools=...)`` and the API take)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    @classmethod
    def from_schema(cls, entry: Mapping[str, Any], fn: Callable[..., Any] | None = None) -> Tool:
        """A tool from an OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``)."""
        fn_spec = entry.get("function", entry)
        return cls(
            name=fn_spec.get("name", ""),
            description=fn_spec.get("description", ""),
            parameters=fn_spec.get("parameters") or {"type": "object", "properties": {}},
            fn=fn,
        )

    def missing_arguments(self, arguments: Mapping[str, Any]) -> list[str]:
        """Required arguments (per the schema) that ``arguments`` lacks."""
        return [k for k in self.parameters.get("required", ()) if k not in arguments]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]
    id: str = ""

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (arguments as a JSON string)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(dict(self.arguments))},
        }


@dataclass(frozen=True)
class ToolCallParse:
    content: str  # the text outside tool-call blocks, stripped
    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]  # one message per malformed block


def parse_tool_calls(text: str, id_prefix: str = "call") -> ToolCallParse:
    """Split a model turn into content and tool calls; malformed blocks become ``errors``.

    An opening tag without its closing tag (a turn cut by max_tokens) is an error too.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for k, match in enumerate(_BLOCK.finditer(text)):
        body = match.group(1).strip()
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(
                f"tool call {k}: body is not JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}"
            )
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            errors.append(f'tool call {k}: expected {{"name": str, "arguments": {{...}}}}, got {body[:80]!r}')
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):  # not JSON: refused just below
                arguments = json.loads(arguments) if arguments.strip() else {}
        if not isinstance(arguments, dict):
            errors.append(
                f"tool call {k} ({payload['name']}): arguments must be a JSON object, got {arguments!r}"
            )
            continue
        calls.append(ToolCall(payload["name"], arguments, f"{id_prefix}_{k}"))
    content = _BLOCK.sub("", text)
    if TOOL_CALL_OPEN in content:
        errors.append(f"an unclosed {TOOL_CALL_OPEN} block (the turn may have hit max_tokens)")
        content = content[: content.index(TOOL_CALL_OPEN)]
    return ToolCallParse(content.strip(), tuple(calls), tuple(errors))


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The text of one call in the documented format (what demonstrations for SFT contain)."""
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': dict(arguments)})}\n{TOOL_CALL_CLOSE}"


def run_tool(tools: Mapping[str, Tool], call: ToolCall) -> tuple[str, bool]:
    """Run one call; ``(result text, ok)``. Unknown tools, missing arguments and exceptions give ok=False."""
    tool = tools.get(call.name)
    if tool is None:
        return f"error: unknown tool {call.name!r}; available: {', '.join(sorted(tools))}", False
    missing = tool.missing_arguments(call.arguments)
    if missing:
        return f"error: {call.name} needs arguments {missing}", False
    if tool.fn is None:
        return f"error: tool {call.name!r} has no implementation here", False
    try:
        return str(tool.fn(**call.arguments)), True
    except Exception as exc:  # the model sees the error and may try again
        return f"error: {type(exc).__name__}: {exc}", False


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [t.schema() for t in tools]
