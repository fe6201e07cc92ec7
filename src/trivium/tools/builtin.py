"""Built-in tools. ``TOOLS`` maps a name to a ``Tool``; workflows name the tools they offer.

``calculator`` evaluates arithmetic (+ - * / // % ** and parentheses on numbers) by walking the Python
AST: no ``eval``, no names, no calls, and bounded exponents, so a model cannot run code through it.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence

from trivium.registry import Registry, instance_of
from trivium.tools.calls import Tool

__all__ = ["TOOLS", "calculate", "get_tools", "register_tool"]

TOOLS: Registry[Tool] = Registry(
    "tool",
    doc="a trivium.tools.Tool (name, description, JSON-schema parameters, fn)",
    check=instance_of(Tool),
)


def register_tool(tool: Tool) -> Tool:
    """Register ``tool`` under its own ``name``."""
    return TOOLS.register(tool.name)(tool)


def get_tools(names: Sequence[str]) -> list[Tool]:
    """The tools called ``names`` (registered names or ``module:TOOL``), in order."""
    return [TOOLS.get(n) for n in names]


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text (integers without a trailing .0)."""
    if not isinstance(expression, str) or len(expression) > 200:
        raise ValueError("expression must be a string of at most 200 characters")
    tree = ast.parse(expression.replace("^", "**"), mode="eval")

    def value(node: ast.AST) -> float | int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large (at most 64)")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, got {ast.dump(node)[:40]}")

    result = value(tree)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(round(result, 6) if isinstance(result, float) else result)


register_tool(
    Tool(
        name="calculator",
        description="Evaluate an arithmetic expression and return its value.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 37 * 48 + 2"}},
            "required": ["expression"],
        },
        fn=calculate,
    )
)
