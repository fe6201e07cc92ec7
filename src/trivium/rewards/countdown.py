"""``countdown``: 1 when the answer's expression reaches ``data["target"]`` using ``data["numbers"]``.

The expression is the content of the last ``<answer>...</answer>``, else the rest of the line after the
last ``####``, else the response's last non-empty line. It is parsed with ``ast`` and only a whitelist is
accepted: integer literals, ``+ - * /`` between two expressions, and parentheses. Nothing is evaluated by
Python: the tree is walked here, with exact fractions (``/`` is exact division; dividing by zero makes
the answer invalid). Each literal must be one of the given numbers, each used at most as often as it is
given (``use_all: true``: every number exactly once). A unary minus, a float, ``**``, a name or a call is
refused (scored as a malformed answer), and so is an expression longer than ``MAX_CHARS``.

Scores (``reward_args``): ``1`` when right; ``format_score`` (default 0) when the expression is
well-formed with allowed numbers but misses the target; 0 otherwise. Metrics: ``accuracy`` (right),
``format`` (an expression was found and parsed), ``valid_numbers`` (its numbers are allowed).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from trivium.rewards.registry import RewardResult, register_reward

__all__ = ["MAX_CHARS", "CountdownAnswer", "evaluate", "extract_expression"]

MAX_CHARS = 200
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class CountdownAnswer(ValueError):
    """The expression is not a countdown answer: ``str(err)`` says why."""


def extract_expression(response: str) -> str | None:
    """The expression a response gives (module docstring), or None."""
    tagged = _ANSWER.findall(response)
    if tagged:
        return tagged[-1].strip() or None
    cut = response.rfind("####")
    if cut >= 0:
        return response[cut + 4 :].split("\n", 1)[0].strip() or None
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    return lines[-1] if lines else None


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``expression`` and the integer literals it uses; ``CountdownAnswer`` if it is not
    a whitelisted arithmetic expression or divides by zero."""
    if len(expression) > MAX_CHARS:
        raise CountdownAnswer(f"longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError) as err:
        raise CountdownAnswer(f"not an expression: {err.__class__.__name__}") from None
    numbers: list[int] = []
    return _walk(tree.body, numbers), numbers


def _walk(node: ast.AST, numbers: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, numbers), _walk(node.right, numbers)
        op = _OPS[type(node.op)]
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            return left * right
        if right == 0:
            raise CountdownAnswer("divides by zero")
        return left / right
    raise CountdownAnswer(f"{type(node).__name__} is not allowed (integers, + - * / and parentheses only)")


def _gold(data: Mapping[str, Any]) -> tuple[list[int], int]:
    numbers, target = data.get("numbers"), data.get("target")
    ok = isinstance(numbers, list) and all(type(n) is int for n in numbers) and type(target) is int
    if not ok:
        raise ValueError(
            "the countdown reward needs the task fields 'numbers' (a list of integers) and 'target' (an "
            f"integer), got numbers={numbers!r:.60} target={target!r:.30}; use the countdown workflow or map "
            "the columns with fields: {numbers: ..., target: ...}"
        )
    return numbers, target


def _numbers_allowed(used: list[int], given: list[int], use_all: bool) -> bool:
    have, want = Counter(given), Counter(used)
    return have == want if use_all else all(want[n] <= have[n] for n in want)


def _check(args: Mapping[str, Any]) -> None:
    score = args.get("format_score", 0.0)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
        raise ValueError(f"reward_args.format_score must be a number in [0, 1], got {score!r}")
    if not isinstance(args.get("use_all", False), bool):
        raise ValueError(f"reward_args.use_all must be true or false, got {args['use_all']!r}")


@register_reward("countdown", check_args=_check)
def countdown_reward(
    response: str, data: Mapping[str, Any], format_score: float = 0.0, use_all: bool = False
) -> RewardResult:
    numbers, target = _gold(data)
    expression = extract_expression(response)
    try:
        if expression is None:
            raise CountdownAnswer("no expression")
        value, used = evaluate(expression)
    except CountdownAnswer:
        return RewardResult(0.0, {"accuracy": 0.0, "format": 0.0, "valid_numbers": 0.0})
    allowed = _numbers_allowed(used, numbers, use_all)
    right = allowed and value == target
    reward = 1.0 if right else (float(format_score) if allowed else 0.0)
    return RewardResult(reward, {"accuracy": float(right), "format": 1.0, "valid_numbers": float(allowed)})
