"""How long an explore task may run: the fixed ``explorer.workflow_timeout_s``, or a limit that follows
the run (``explorer.dynamic_timeout``).

In agentic RL the slowest few tasks set a step's pace: one environment call that hangs holds the whole
batch for the configured worst case. With ``dynamic_timeout.enable`` a task's limit is ``ratio`` times the
mean duration of the last ``window`` tasks that succeeded (once ``min_samples`` of them have), never above
the fixed limit when one is set. The limit is enforced where a task can be stopped: at its next model call
(``models/handle.py``) and around each environment call (``envs/calls.py``), which then fails with a
message naming ``explorer.dynamic_timeout``. Evaluation tasks keep the fixed limit (a greedy evaluation
is not the training tasks' distribution of durations).

The durations are part of the explorer's state, so a resumed run starts with the limit it had.
"""

from __future__ import annotations

from collections import deque

__all__ = ["TaskTimeouts"]


class TaskTimeouts:
    def __init__(
        self, fixed_s: float = 0.0, *, ratio: float = 0.0, window: int = 64, min_samples: int = 8
    ) -> None:
        if ratio and ratio < 1:
            raise ValueError(
                f"explorer.dynamic_timeout.ratio must be >= 1 (a multiple of the mean), got {ratio}"
            )
        self.fixed_s = fixed_s  # 0: no fixed limit
        self.ratio = ratio  # 0: no dynamic limit
        self.min_samples = min_samples
        self._seconds: deque[float] = deque(maxlen=window)  # durations of recent successful tasks

    def limit(self, explore: bool = True) -> tuple[float, str]:
        """``(seconds, what sets them)`` for a task starting now; 0 seconds: no limit."""
        fixed = (self.fixed_s, f"explorer.workflow_timeout_s={self.fixed_s:g} s")
        if not (explore and self.ratio) or len(self._seconds) < self.min_samples:
            return fixed
        mean = sum(self._seconds) / len(self._seconds)
        dynamic = self.ratio * mean
        if self.fixed_s and self.fixed_s <= dynamic:
            return fixed
        return dynamic, (
            f"explorer.dynamic_timeout: {self.ratio:g} x the mean {mean:.3g} s of the last "
            f"{len(self._seconds)} successful tasks = {dynamic:.3g} s"
        )

    def succeeded(self, seconds: float) -> None:
        """A task that ran to the end in ``seconds`` (failed ones would pull the mean towards the limit)."""
        if self.ratio:
            self._seconds.append(seconds)

    def state_dict(self) -> list[float]:
        return list(self._seconds)

    def load_state_dict(self, seconds: list[float]) -> None:
        self._seconds.clear()
        self._seconds.extend(seconds)
