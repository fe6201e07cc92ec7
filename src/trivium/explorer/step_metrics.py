"""A task's result, what one explore step counts, and the metrics made from them: rewards, lengths, task durations, @k.

``StepTally`` adds up a step's sampling rounds (``Explorer._sample_groups``); ``summarize`` and ``at_k``
turn experiences and task results into the ``rollout/*`` and ``eval/*`` metrics.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from trivium.types import Experience, Task

__all__ = ["StepTally", "TaskResult", "at_k", "duration_metrics", "summarize"]


@dataclass
class TaskResult:
    task: Task
    experiences: list[Experience]
    error: BaseException | None = None
    failed_runs: int = 0  # episodes the workflow dropped (an environment raised or hung)
    retries: int = 0  # extra attempts the task took
    skipped_long: bool = False  # its prompt filled the model's context (on_long_row: skip)
    truncated_prompts: int = 0  # prompts cut to fit the context (on_long_row: truncate)
    seconds: float = 0.0  # from its start to its result, retries included
    cancelled: bool = False  # the step went ahead without it (over-rollout): dropped, not failed

    @property
    def timed_out(self) -> bool:
        return isinstance(self.error, TimeoutError)  # its time limit (model call or environment call)


@dataclass
class StepTally:
    """What one explore step counts over its sampling rounds (its metrics are made from it)."""

    version: int  # the weights version the step samples with
    tasks: int = 0
    failed: int = 0
    failed_runs: int = 0
    retries: int = 0
    skipped_long: int = 0
    truncated: int = 0
    rounds: int = 0  # extra rounds of dynamic sampling
    dropped: int = 0  # groups the experience operators dropped
    groups: int = 0
    informative: int = 0  # groups with some reward variance
    unused: int = 0  # groups that finished beyond batch_size (over-rollout's wait): not trained
    timed_out: int = 0  # tasks stopped by their time limit
    cancelled: int = 0  # tasks the step went ahead without (over-rollout)
    task_seconds: list[float] = dataclasses.field(default_factory=list)  # each task's duration
    sampled: list[Experience] = dataclasses.field(default_factory=list)  # every experience sampled
    op_metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def count(self, tasks: Sequence[Task], results: Sequence[TaskResult]) -> None:
        self.tasks += len(tasks)
        self.failed += sum(r.error is not None for r in results)
        self.failed_runs += sum(r.failed_runs for r in results)
        self.retries += sum(r.retries for r in results)
        self.skipped_long += sum(r.skipped_long for r in results)
        self.truncated += sum(r.truncated_prompts for r in results)
        self.timed_out += sum(r.timed_out for r in results)
        self.cancelled += sum(r.cancelled for r in results)
        self.task_seconds += [r.seconds for r in results]


def duration_metrics(seconds: Sequence[float]) -> dict[str, float]:
    """The step's task durations: median, 95th percentile (nearest rank) and longest."""
    if not seconds:
        return {}
    ranked = sorted(seconds)
    at = lambda q: ranked[min(len(ranked) - 1, max(0, math.ceil(q * len(ranked)) - 1))]  # noqa: E731
    return {
        "rollout/task_seconds_p50": at(0.5),
        "rollout/task_seconds_p95": at(0.95),
        "rollout/task_seconds_max": ranked[-1],
    }


def at_k(results: Sequence[TaskResult], k: int, prefix: str) -> dict[str, float]:
    """mean@k, best@k and worst@k of accuracy (the reward where a workflow reports no accuracy)."""
    per_task = [
        [e.metrics.get("accuracy", e.reward) for e in r.experiences] for r in results if r.experiences
    ]
    if k <= 1 or not per_task:
        return {}
    n = len(per_task)
    return {
        f"{prefix}/mean@{k}": sum(sum(a) / len(a) for a in per_task) / n,
        f"{prefix}/best@{k}": sum(max(a) for a in per_task) / n,
        f"{prefix}/worst@{k}": sum(min(a) for a in per_task) / n,
    }


def summarize(experiences: Sequence[Experience], prefix: str) -> dict[str, float]:
    """Mean reward, accuracy and response length of experiences, plus every numeric workflow metric:
    averaged, except ``count/...`` metrics (e.g. ``count/reward_error``), which are summed."""
    if not experiences:
        return {f"{prefix}/count": 0.0}
    n = len(experiences)
    rewards = [e.reward for e in experiences]
    mean = sum(rewards) / n
    out = {
        f"{prefix}/count": float(n),
        f"{prefix}/reward_mean": mean,
        f"{prefix}/reward_std": (sum((r - mean) ** 2 for r in rewards) / max(1, n - 1)) ** 0.5,
        f"{prefix}/response_tokens": float(sum(e.response_length for e in experiences)),
    }
    keys = sorted({k for e in experiences for k in e.metrics})
    for k in keys:
        values = [e.metrics[k] for e in experiences if k in e.metrics]
        out[f"{prefix}/{k}"] = sum(values) if k.startswith("count/") else sum(values) / len(values)
    return out
