"""How deep JSON nests, read from its text before it is parsed (a row of a task file, a request body): a
deeply nested value is refused before ``json.loads`` recurses into it."""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

__all__ = ["text_depth", "value_depth"]

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def text_depth(text: str, limit: int = 0) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (``{"a": [1]}``: 2), without parsing it:
    brackets inside strings do not count. Linear time; malformed text gives some number, never an error.
    With ``limit``, text with at most ``limit`` opening brackets returns their count (an upper bound of
    the depth, so ``> limit`` is still exact) without scanning."""
    opens = text.count("[") + text.count("{")
    if opens <= max(limit, 1):
        return opens
    steps = [1 if c in "[{" else -1 for c in _BRACKETS.findall(_JSON_STRING.sub("", text))]
    return max(accumulate(steps), default=0)


def value_depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed JSON ``value`` (containers only: ``{"a": [1]}`` is 2), counted without
    recursion and up to ``limit + 1`` at most (a deeper value stops the count)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest
