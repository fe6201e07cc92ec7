"""The guard in front of the weights: no non-finite or absurd number reaches an optimizer step.

One bad value (a reward of 1e308 sent to the serve mode's feedback, a loss that overflows) would otherwise
turn every weight into NaN, and every later sample and version with it. So, every step:
- experiences whose reward is non-finite or beyond ``trainer.max_abs_reward`` are dropped before training
  (counted in ``train/dropped_experiences`` and logged with their task ids);
- a step whose advantages are not finite is skipped whole (``train/skipped_steps``);
- an optimizer update whose gradient norm is non-finite or above ``trainer.skip_grad_norm`` is not made
  (``train/skipped_updates``; the optimizer and the schedule stay where they were, see ``optim.py``).
The weights stay the last good ones. After ``trainer.max_bad_steps`` steps in a row with something
skipped, the run stops with ``TrainingDiverged``: something upstream is broken, and the newest checkpoint
holds the last good weights. Every rank decides alike (rewards and gradient norms are the same on all).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from trivium.types import Experience

log = logging.getLogger(__name__)

__all__ = ["NumericGuard", "TrainingDiverged"]


class TrainingDiverged(RuntimeError):
    """Too many train steps in a row had non-finite or absurd numbers; the run stops."""


class NumericGuard:
    def __init__(self, max_abs_reward: float, max_bad_steps: int):
        self.max_abs_reward = max_abs_reward
        self.max_bad_steps = max_bad_steps
        self.bad_in_a_row = 0

    def rewards(self, experiences: Sequence[Experience]) -> tuple[list[Experience], int]:
        """The experiences with a finite reward within ``max_abs_reward``, and how many were dropped."""
        good = [math.isfinite(e.reward) and abs(e.reward) <= self.max_abs_reward for e in experiences]
        kept = [e for e, ok in zip(experiences, good) if ok]
        dropped = len(experiences) - len(kept)
        if dropped:
            bad = [(e.task_id, e.reward) for e, ok in zip(experiences, good) if not ok][:5]
            log.warning(
                "dropped %d experience(s) whose reward is non-finite or beyond trainer.max_abs_reward=%g "
                "(task id, reward: %s); they are not trained on",
                dropped,
                self.max_abs_reward,
                bad,
            )
        return kept, dropped

    def step_done(self, step: int, skipped: str | None) -> None:
        """Count a train step; ``skipped`` says what was skipped in it (None: nothing)."""
        if skipped is None:
            self.bad_in_a_row = 0
            return
        self.bad_in_a_row += 1
        log.warning("train step %d: %s; the weights are unchanged by it", step, skipped)
        if self.bad_in_a_row >= self.max_bad_steps:
            raise TrainingDiverged(
                f"{self.bad_in_a_row} train steps in a row skipped updates (the last at step {step}: {skipped}). "
                "No bad value reached the weights: the newest checkpoint holds the last good ones. Check the "
                "rewards and data, lower trainer.lr, or raise trainer.max_bad_steps to tolerate more"
            )
