"""Read policies of a persistent experience storage: FIFO exactly-once, and priority replay.

``Fifo`` serves every experience once, oldest first. ``ReplayPolicy`` serves the highest-priority
*eligible* experiences and may serve one again, within limits:

- priority ``= version_weight * model_version - use_weight * use_count``: fresh data from newer weights
  first, and each use pushes an experience down. Ties go to the smaller id (the older experience).
- eligible when ``use_count < max_uses`` (``None``: no limit) and it was not used in the last
  ``cooldown_steps`` steps: used at step ``s``, it may be served again from step ``s + cooldown_steps + 1``
  (``cooldown_steps=0``: from the next step).

A "use" is counted when the consumer *commits* the batch (see ``storage.py``), not when it reads it, so a
crashed reader does not use up an experience. ``step`` is the consumer's step clock: the trainer step
when the trainer passes one, otherwise the storage counts the consumer's reads.

The methods here are the reference semantics. ``priority`` is written so that it works on numbers and on
SQLAlchemy columns alike, so the SQL storage orders by the very same formula; eligibility is restated in
SQL there and a test checks the two agree.

Left out: sampling proportional to priority (PER-style, with importance weights). Taking the top rows is
deterministic, which exact resume needs; a stochastic sampler would have to checkpoint its RNG too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["FIFO", "Fifo", "ReadPolicy", "ReplayPolicy", "rank"]


@dataclass(frozen=True)
class Fifo:
    """Every experience exactly once, in write order."""


FIFO = Fifo()


@dataclass(frozen=True)
class ReplayPolicy:
    version_weight: float = 1.0  # priority per model version: > 0 prefers data from newer weights
    use_weight: float = 1.0  # priority lost per past use: > 0 prefers less-used data
    cooldown_steps: int = 0  # steps after a use during which an experience is not served again
    max_uses: int | None = None  # uses after which an experience is retired; None: no limit

    def __post_init__(self) -> None:
        if self.cooldown_steps < 0:
            raise ValueError(
                f"ReplayPolicy(cooldown_steps={self.cooldown_steps}): must be >= 0 steps "
                "(0 lets an experience be served again at the next step)"
            )
        if self.max_uses is not None and self.max_uses < 1:
            raise ValueError(
                f"ReplayPolicy(max_uses={self.max_uses}): must be >= 1, or None for no limit "
                "(1 serves each experience once, in priority order)"
            )

    def priority(self, model_version: Any, use_count: Any) -> Any:
        """Higher is served first. Numbers in, number out; SQL columns in, SQL expression out."""
        return self.version_weight * model_version - self.use_weight * use_count

    def eligible(self, use_count: int, last_use_step: int | None, step: int) -> bool:
        if self.max_uses is not None and use_count >= self.max_uses:
            return False
        return last_use_step is None or step - last_use_step > self.cooldown_steps


ReadPolicy = Fifo | ReplayPolicy


def rank(
    policy: ReplayPolicy, rows: Iterable[tuple[int, int, int, int | None]], step: int, n: int
) -> list[int]:
    """Reference selection: ids of the ``n`` best eligible ``(id, model_version, use_count, last_use_step)``."""
    eligible = [r for r in rows if policy.eligible(r[2], r[3], step)]
    eligible.sort(key=lambda r: (-policy.priority(r[1], r[2]), r[0]))
    return [r[0] for r in eligible[:n]]
