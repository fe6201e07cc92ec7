"""The explorer's task stream: one or several task sets, mixed by weight, each read by its selector.

``TaskFeed`` offers what the explorer asks of a task set (``next_batch``, ``all_tasks``, ``len``,
``state_dict``) plus ``observe(task, experiences)``, which hands each rollout's scores to the selector of the
task's set (``online_difficulty`` learns from them).

Mixing is deterministic (smooth weighted round robin): slot k of the stream goes to the source whose share
of the k slots so far lags its weight the most, ties to the first listed. After any number of tasks every
source's count is within one task of weight_i / Σ weights of the total, so the ratios hold at every step,
and the state is the per-source counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trivium.buffer.selectors import TaskSelector
from trivium.types import Experience, Task

__all__ = ["TaskFeed", "TaskSource", "rollout_scores"]


@dataclass
class TaskSource:
    name: str
    tasks: list[Task]
    weight: float
    selector: TaskSelector
    skipped_rows: int = 0


def rollout_scores(experiences: Sequence[Experience]) -> list[float]:
    """A score in [0, 1] per experience: its ``accuracy`` metric, else its reward clipped to [0, 1]."""
    return [min(1.0, max(0.0, float(e.metrics.get("accuracy", e.reward)))) for e in experiences]


class TaskFeed:
    def __init__(self, sources: Sequence[TaskSource]) -> None:
        if not sources:
            raise ValueError("TaskFeed needs at least one task source (buffer.taskset or buffer.tasksets)")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(
                f"task sets of one stage need distinct names (they prefix task ids), got {names}: set "
                "buffer.tasksets[i].name"
            )
        bad = [s.name for s in sources if not s.weight > 0]
        if bad:
            raise ValueError(f"task sets {bad}: weight must be > 0 (buffer.tasksets[i].weight)")
        self.sources = list(sources)
        self.name = names[0] if len(names) == 1 else "+".join(names)
        self.taken = [0] * len(sources)
        total = sum(s.weight for s in sources)
        self.shares = [s.weight / total for s in sources]
        self._where = {t.task_id: (i, j) for i, s in enumerate(sources) for j, t in enumerate(s.tasks)}

    def __len__(self) -> int:
        return sum(len(s.tasks) for s in self.sources)

    @property
    def skipped_rows(self) -> int:
        return sum(s.skipped_rows for s in self.sources)

    def all_tasks(self) -> list[Task]:
        return [t for s in self.sources for t in s.tasks]

    def _next_source(self) -> int:
        count = sum(self.taken) + 1
        lag = [share * count - taken for share, taken in zip(self.shares, self.taken, strict=True)]
        best = max(range(len(lag)), key=lambda i: (lag[i], -i))
        self.taken[best] += 1
        return best

    def next_batch(self, batch_size: int) -> list[Task]:
        """The next ``batch_size`` tasks: their sources by weight, each source's tasks by its selector."""
        if batch_size < 1:
            raise ValueError(
                f"task feed {self.name!r}: next_batch(batch_size={batch_size}) needs batch_size >= 1"
            )
        slots = [self._next_source() for _ in range(batch_size)]
        picks = {i: iter(self.sources[i].selector.select(slots.count(i))) for i in set(slots)}
        return [self.sources[i].tasks[next(picks[i])] for i in slots]

    def observe(self, task: Task, experiences: Sequence[Experience]) -> None:
        """Tell the task's selector how its rollouts scored (tasks of other feeds are ignored)."""
        where = self._where.get(task.task_id)
        if where is not None and experiences:
            self.sources[where[0]].selector.observe(where[1], rollout_scores(experiences))

    def state_dict(self) -> dict[str, Any]:
        return {
            "names": [s.name for s in self.sources],
            "taken": list(self.taken),
            "selectors": [s.selector.state_dict() for s in self.sources],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "names" not in state and "epoch" in state and len(self.sources) == 1:
            state = _from_reader_state(state, self.sources[0])
        names = [s.name for s in self.sources]
        if list(state.get("names", [])) != names:
            raise ValueError(
                f"task feed: the checkpoint was saved with task sets {state.get('names')}, this run has {names}; "
                "resume with the task sets it was saved with"
            )
        self.taken = [int(x) for x in state["taken"]]
        for source, saved in zip(self.sources, state["selectors"], strict=True):
            source.selector.load_state_dict(saved)


def _from_reader_state(state: Mapping[str, Any], source: TaskSource) -> dict[str, Any]:
    """A checkpoint of an earlier version saved the task reader's (epoch, position): the same place in the
    same order for the ``shuffle`` / ``sequential`` selector (the selector refuses it otherwise)."""
    kind = "Shuffle" if state.get("shuffle", True) else "Sequential"
    selector = {"kind": kind, "num_tasks": state.get("num_tasks"), "seed": state.get("seed"), "batches": 0}
    selector.update(epoch=state["epoch"], position=state["position"])
    return {"names": [source.name], "taken": [0], "selectors": [selector]}
