"""A task set on disk (or in memory) as a resumable stream of ``Task`` batches.

Design decisions:
- Built from explicit arguments; turning a config section into them is the config layer's job.
- Every row is loaded and checked at construction (see ``task_checks``): an unusable row (a missing or
  mistyped field, or a line that is not a JSON object at all) is an error naming the file, row, field and
  fix, or, with ``on_bad_row="skip"``, a counted skip (``skip_reasons``).
- ``Task.index`` and the ``task_id`` (``"{name}:{index}"``) use the row's index in the task set *before*
  skipping, so an id always points at the same row of the file.
- The order of epoch ``e`` is a permutation seeded by ``(seed, e)`` alone, so ``(epoch, position)`` is
  the whole iteration state: ``state_dict()`` saves it and a resumed run continues with the same tasks.
- ``max_rows`` keeps the first rows of the file (before skipping): a cheap way to run on a slice without
  reading (JSON Lines) and checking the rest.

Left out: streaming task sets larger than memory, and weighting or mixing task sets (a caller can hold
several readers).
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from trivium.buffer.task_checks import (
    FieldSpec,
    RowProblem,
    check_row,
    describe_problems,
    field_specs,
    missing_columns,
)
from trivium.buffer.task_files import TaskDataError, load_rows
from trivium.types import Task

__all__ = ["TaskSetReader"]

logger = logging.getLogger(__name__)


class TaskSetReader:
    """Tasks of one task set, in file order (``all_tasks``) or as seeded, resumable epochs (``next_batch``).

    ``fields`` maps a canonical field (what the workflow reads from ``Task.data``) to a column of the file;
    a field of ``required`` that ``fields`` does not map reads the column of the same name. ``required``
    gives the allowed Python types per field, e.g. ``{"question": (str,), "answer": (str, int, float)}``.
    ``all_columns`` puts every column of the row in ``Task.data`` too (mapped fields win), for workflows
    whose environment decides what it reads (multi-turn workflows).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[Mapping[str, Any]],
        *,
        name: str,
        fields: Mapping[str, str],
        required: Mapping[str, tuple[type, ...]],
        workflow: str,
        reward_fn: str,
        repeat_times: int,
        workflow_args: Mapping[str, Any] | None = None,
        reward_args: Mapping[str, Any] | None = None,
        reward_timeout_s: float = 0.0,
        on_long_row: Literal["skip", "truncate", "error"] = "skip",
        is_eval: bool = False,
        split: str = "train",
        on_bad_row: Literal["error", "skip"] = "error",
        shuffle: bool = True,
        seed: int = 0,
        max_rows: int | None = None,
        all_columns: bool = False,
    ) -> None:
        _check_args(name, repeat_times, on_bad_row, max_rows)
        self.name, self.shuffle, self.seed = name, shuffle, seed
        loaded = load_rows(path, split=split, taskset=name, on_bad_row=on_bad_row, max_rows=max_rows)
        rows = loaded.rows
        specs = field_specs(fields, required)
        where = loaded.sources[0].name if len(loaded.sources) == 1 else str(path)
        _check_columns(name, specs, [r for i, r in enumerate(rows) if i not in loaded.unreadable], where)

        problems = _row_problems(rows, loaded.unreadable, specs)
        if problems and on_bad_row == "error":
            raise TaskDataError(describe_problems(name, len(rows), problems, loaded.locate))
        bad = {p.index for p in problems}
        self.skipped_rows = len(bad)
        self.skip_reasons: dict[str, int] = dict(Counter(p.reason for p in problems))
        if self.skipped_rows:
            logger.warning(
                "task set %r: skipped %d of %d rows (%s)", name, len(bad), len(rows), self.skip_reasons
            )
        if len(bad) == len(rows):
            detail = describe_problems(name, len(rows), problems, loaded.locate) if problems else ""
            raise TaskDataError(
                f"task set {name!r} has no usable rows ({len(rows)} read from {where}).\n{detail}"
            )

        common = {
            "workflow": workflow,
            "reward_fn": reward_fn,
            "repeat_times": repeat_times,
            "workflow_args": dict(workflow_args or {}),
            "reward_args": dict(reward_args or {}),
            "reward_timeout_s": reward_timeout_s,
            "on_long_row": on_long_row,
            "is_eval": is_eval,
            "taskset": name,
        }
        self._tasks = [
            Task(
                task_id=f"{name}:{i}",
                data={
                    **(row if all_columns else {}),
                    **{s.field: row[s.column] for s in specs if row.get(s.column) is not None},
                },
                index=i,
                raw=row,
                **common,
            )
            for i, row in enumerate(rows)
            if i not in bad
        ]
        self._epoch, self._position = 0, 0
        self._order_epoch = -1  # the epoch self._order belongs to
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def epoch(self) -> int:
        """Completed passes over the task set (the epoch the next task comes from)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Tasks already taken from the current epoch."""
        return self._position

    def all_tasks(self) -> list[Task]:
        """Every task in file order (for eval sets); does not move the iteration state."""
        return list(self._tasks)

    def next_batch(self, batch_size: int) -> list[Task]:
        """The next ``batch_size`` tasks; a batch that crosses the end of an epoch continues into the next."""
        if batch_size < 1:
            raise ValueError(
                f"task set {self.name!r}: next_batch(batch_size={batch_size}) needs batch_size >= 1"
            )
        batch: list[Task] = []
        while len(batch) < batch_size:
            order = self._epoch_order()
            take = min(batch_size - len(batch), len(order) - self._position)
            batch += [self._tasks[i] for i in order[self._position : self._position + take]]
            self._position += take
            if self._position == len(order):
                self._epoch, self._position = self._epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "position": self._position,
            "num_tasks": len(self._tasks),
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was saved; refuses a state saved for different data or order."""
        mine = self.state_dict()
        changed = [k for k in ("num_tasks", "seed", "shuffle") if k in state and state[k] != mine[k]]
        if changed:
            diff = ", ".join(f"{k}: saved {state[k]!r}, now {mine[k]!r}" for k in changed)
            raise ValueError(
                f"task set {self.name!r}: the saved reader state does not match this task set ({diff}), so "
                "the run would not resume at the same task. Restore the data/seed/shuffle it was saved with, "
                "or start the task set from the beginning by not loading its state"
            )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < max(len(self._tasks), 1):
            raise ValueError(
                f"task set {self.name!r}: saved state epoch={epoch}, position={position} is out of range "
                f"for {len(self._tasks)} tasks; the state is corrupt or from another task set"
            )
        self._epoch, self._position = epoch, position

    def _epoch_order(self) -> list[int]:
        if self._order_epoch != self._epoch:
            self._order = list(range(len(self._tasks)))
            if self.shuffle:  # a str seed goes through sha512: stable across runs and platforms
                random.Random(f"{self.seed}/{self._epoch}").shuffle(self._order)
            self._order_epoch = self._epoch
        return self._order


def _check_args(name: str, repeat_times: int, on_bad_row: str, max_rows: int | None) -> None:
    if not name:
        raise ValueError("TaskSetReader: name must be a non-empty string (it prefixes every task_id)")
    if repeat_times < 1:
        raise ValueError(f"task set {name!r}: repeat_times={repeat_times} must be >= 1 (samples per task)")
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"task set {name!r}: on_bad_row={on_bad_row!r}; choose 'error' or 'skip'")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"task set {name!r}: max_rows={max_rows} must be >= 1, or None for all rows")


def _row_problems(
    rows: list[dict[str, Any]], unreadable: Mapping[int, tuple[str, str]], specs: list[FieldSpec]
) -> list[RowProblem]:
    """Every row's problems in row order; an unreadable row (skip mode) is one problem of its own."""
    problems = []
    for i, row in enumerate(rows):
        if i in unreadable:
            problems.append(RowProblem(i, None, "unreadable", unreadable[i]))
        else:
            problems += check_row(i, row, specs)
    return problems


def _check_columns(name: str, specs: list[FieldSpec], rows: list[dict[str, Any]], where: str) -> None:
    absent = missing_columns(specs, rows)
    if absent and rows:
        columns = sorted({c for row in rows for c in row})
        maps = ", ".join(f"{s.field}: <your column>" for s in absent)
        cols = ", ".join(f"{s.column!r} (for field {s.field!r})" for s in absent)
        raise TaskDataError(
            f"task set {name!r}: {where} has no column {cols}; its columns are {columns}. "
            f"Map the columns with fields: {{{maps}}}"
        )
