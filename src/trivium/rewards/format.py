"""``format``: 1 when the response has the required shape, else 0 (a regex or a template, in ``reward_args``).

    reward_fn: format
    reward_args: {template: "<think>{}</think>\\n<answer>{}</answer>"}    # or
    reward_args: {pattern: "^#### -?\\\\d+$", flags: [MULTILINE], match: search}

- ``template``: literal text with ``{}`` (or ``{name}``) holes; a hole matches any text, newlines included
  (shortest first), a run of whitespace matches any whitespace (none included). ``{{`` and ``}}`` are
  literal braces. The response must match as a whole (its leading and trailing whitespace ignored).
- ``pattern``: a Python regular expression; ``match``: ``full`` (the whole stripped response, the
  default) or ``search`` (anywhere in it); ``flags``: names of ``re`` flags (``IGNORECASE``,
  ``MULTILINE``, ``DOTALL``, ``VERBOSE``, ``ASCII``).
- ``reward`` / ``penalty``: the scores for a match and a miss (defaults 1 and 0), so the reward can be a
  bonus to add to another reward by a shaper, or a penalty.

Exactly one of ``pattern`` and ``template`` is given; ``check-config`` compiles it. Metrics: ``format``
(1 on a match). Patterns are compiled once per distinct argument set (an LRU cache); Python's ``re`` can
backtrack for long on pathological patterns, which the reward's time limit (``reward_timeout_s``) ends.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trivium.rewards.registry import RewardResult, register_reward

__all__ = ["compile_format", "template_regex"]

_FLAGS = ("IGNORECASE", "MULTILINE", "DOTALL", "VERBOSE", "ASCII")
_HOLE = re.compile(r"\{\{|\}\}|\{[A-Za-z_]*\}|\s+|[^{}\s]+|[{}]")


def template_regex(template: str) -> str:
    """The regex of a ``template`` (module docstring); ``ValueError`` on a lone brace."""
    parts = []
    for token in _HOLE.findall(template):
        if token in ("{{", "}}"):
            parts.append(re.escape(token[0]))
        elif token.startswith("{") and token.endswith("}") and len(token) > 1:
            parts.append("(.*?)")
        elif token in ("{", "}"):
            raise ValueError(
                f"format template {template!r} has a lone {token!r}: write {{}} for a hole, {token * 2} for a "
                "literal brace"
            )
        elif token.isspace():
            parts.append(r"\s*")
        else:
            parts.append(re.escape(token))
    return "".join(parts)


@functools.lru_cache(maxsize=256)
def compile_format(
    pattern: str | None, template: str | None, flags: tuple[str, ...] = (), match: str = "full"
) -> tuple[re.Pattern[str], str]:
    """The compiled expression and the match mode; ``ValueError`` says which argument is wrong."""
    if (pattern is None) == (template is None):
        raise ValueError(
            "the format reward needs exactly one of reward_args.pattern and reward_args.template"
        )
    if match not in ("full", "search"):
        raise ValueError(f"reward_args.match={match!r} must be 'full' or 'search'")
    bad = [f for f in flags if f not in _FLAGS]
    if bad:
        raise ValueError(f"reward_args.flags {bad} are not re flags; valid: {', '.join(_FLAGS)}")
    value = 0
    for name in flags:
        value |= getattr(re, name)
    if template is not None:
        if not isinstance(template, str):
            raise ValueError(f"reward_args.template must be a string, got {template!r}")
        return re.compile(template_regex(template), value | re.DOTALL), "full"
    if not isinstance(pattern, str):
        raise ValueError(f"reward_args.pattern must be a string, got {pattern!r}")
    try:
        return re.compile(pattern, value), match
    except re.error as err:
        raise ValueError(f"reward_args.pattern {pattern!r} is not a valid regular expression: {err}") from err


def _compiled(pattern: str | None, template: str | None, flags: Sequence[str], match: str):
    if isinstance(flags, str) or not isinstance(flags, Sequence):
        raise ValueError(f"reward_args.flags must be a list of flag names, got {flags!r}")
    return compile_format(pattern, template, tuple(flags), match)


def _check(args: Mapping[str, Any]) -> None:
    _compiled(args.get("pattern"), args.get("template"), args.get("flags", ()), args.get("match", "full"))
    for key in ("reward", "penalty"):
        value = args.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"reward_args.{key} must be a number, got {value!r}")


@register_reward("format", check_args=_check)
def format_reward(
    response: str,
    data: Mapping[str, Any],
    pattern: str | None = None,
    template: str | None = None,
    flags: Sequence[str] = (),
    match: str = "full",
    reward: float = 1.0,
    penalty: float = 0.0,
) -> RewardResult:
    regex, mode = _compiled(pattern, template, flags, match)
    text = response.strip()
    ok = (regex.fullmatch(text) if mode == "full" else regex.search(text)) is not None
    return RewardResult(float(reward) if ok else float(penalty), {"format": float(ok)})
