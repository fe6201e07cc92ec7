"""Up-front checks of a task set's rows against the fields its workflow needs.

Every row is checked at load time, so a bad row fails the run before the first rollout, not hours in. All
problems are collected first and reported in one error (the first few in full, the rest counted).

Rules, per required field: the value is present and not null; its type is one of the allowed types (a
bool never passes as an int unless bool is allowed); a text value is not empty or whitespace-only and is
real Unicode (no lone UTF-16 surrogate, which JSON can escape but no tokenizer takes). A row
the file reader could not turn into an object (``task_files``: not UTF-8, not JSON, not an object, nested
too deep) is an ``unreadable`` problem of the whole row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from trivium.buffer.task_files import RowLocation

__all__ = ["FieldSpec", "RowProblem", "check_row", "describe_problems", "field_specs", "missing_columns"]

Rule = Literal["missing", "type", "empty", "surrogate", "unreadable"]
_SHOWN = 5  # problems quoted in full in one error


@dataclass(frozen=True)
class FieldSpec:
    field: str  # canonical name, what the workflow reads from Task.data
    column: str  # column in the file
    types: tuple[type, ...] | None  # allowed types; None for an optional field (not checked)


@dataclass(frozen=True)
class RowProblem:
    index: int  # row index in the task set
    spec: FieldSpec | None  # None for an unreadable row
    rule: Rule
    value: Any = None  # unreadable: (kind, why) from the file reader

    @property
    def reason(self) -> str:
        if self.spec is None:
            return f"row: {self.value[0]}"
        return f"{self.spec.field}: {self.rule}"

    def describe(self, where: RowLocation) -> str:
        if self.spec is None:
            return f"{where} {self.value[1]}"
        f, col = self.spec.field, self.spec.column
        head = f"{where}: field {f!r} (column {col!r})"
        if self.rule == "missing":
            return (
                f"{head} has no value (null or absent); fill it in, or map another column with "
                f"fields: {{{f}: <your column>}}"
            )
        if self.rule == "empty":
            return f"{head} is empty or whitespace-only text ({_preview(self.value)}); fill it in"
        if self.rule == "surrogate":
            return f"{head} holds a lone UTF-16 surrogate ({_preview(self.value)}), which is not text; fix the escape"
        allowed = ", ".join(t.__name__ for t in self.spec.types or ())
        return (
            f"{head} is a {type(self.value).__name__} ({_preview(self.value)}), but the workflow accepts "
            f"{allowed}; convert the column, or map a column of that type with fields: {{{f}: <your column>}}"
        )


def field_specs(fields: Mapping[str, str], required: Mapping[str, tuple[type, ...]]) -> list[FieldSpec]:
    """Required fields (checked) then optional mapped ones; a required field not in ``fields`` reads the
    column of the same name."""
    specs = [FieldSpec(f, fields.get(f, f), tuple(types)) for f, types in required.items()]
    specs += [FieldSpec(f, col, None) for f, col in fields.items() if f not in required]
    return specs


def missing_columns(specs: Sequence[FieldSpec], rows: Sequence[Mapping[str, Any]]) -> list[FieldSpec]:
    """Required fields whose column no row has: a mapping mistake, not a bad row."""
    present: set[str] = set()
    for row in rows:
        present.update(row)
    return [s for s in specs if s.types is not None and s.column not in present]


def check_row(index: int, row: Mapping[str, Any], specs: Sequence[FieldSpec]) -> list[RowProblem]:
    problems = []
    for spec in specs:
        if spec.types is None:
            continue
        value = row.get(spec.column)
        if value is None:
            problems.append(RowProblem(index, spec, "missing"))
        elif not isinstance(value, spec.types) or (isinstance(value, bool) and bool not in spec.types):
            problems.append(RowProblem(index, spec, "type", value))
        elif isinstance(value, str) and not value.strip():
            problems.append(RowProblem(index, spec, "empty", value))
        elif isinstance(value, str) and not _encodable(value):
            problems.append(RowProblem(index, spec, "surrogate", value))
    return problems


def describe_problems(
    taskset: str, num_rows: int, problems: Sequence[RowProblem], locate: Callable[[int], RowLocation]
) -> str:
    bad_rows = len({p.index for p in problems})
    counts = ", ".join(f"{reason} x{n}" for reason, n in Counter(p.reason for p in problems).items())
    lines = [f"task set {taskset!r}: {bad_rows} of {num_rows} rows are invalid ({counts}):"]
    lines += [f"  {p.describe(locate(p.index))}" for p in problems[:_SHOWN]]
    if len(problems) > _SHOWN:
        lines.append(f"  ... and {len(problems) - _SHOWN} more problems")
    lines.append("Fix these rows, or set on_bad_row: skip to drop them (counted in skipped_rows).")
    return "\n".join(lines)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
