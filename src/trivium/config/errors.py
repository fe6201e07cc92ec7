"""Config problems: what is wrong, where, why, and how to fix it.

Validation collects every problem first and raises one ``ConfigError`` that lists them all, so a user
fixes a config in one pass instead of one error per run.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    path: str  # dotted field path, e.g. "stages[1].trainer.lr"
    value: Any  # the offending value (or a placeholder when the field is missing)
    rule: str  # the rule that was broken
    fix: str = ""  # what to do about it

    def render(self) -> str:
        value = repr(self.value)
        if len(value) > 80:
            value = value[:77] + "..."
        text = f"  - {self.path or '<root>'} = {value}\n      rule: {self.rule}"
        if self.fix:
            text += f"\n      fix:  {self.fix}"
        return text


class ConfigError(ValueError):
    """Every problem of one config; ``note`` (optional) qualifies the list, e.g. which defaults were used."""

    def __init__(self, problems: Sequence[Problem], source: str = "config", note: str = ""):
        self.problems = list(problems)
        self.source = source
        n = len(self.problems)
        header = f"{source}: {n} problem{'s' if n != 1 else ''} found" + (f" ({note})" if note else "")
        super().__init__("\n".join([header, *(p.render() for p in self.problems)]))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' Did you mean X?' for the closest choice, or '' when none is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else ""


def join_path(*parts: str | int) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p:
            out = f"{out}.{p}" if out else p
    return out
