"""Weights versions: which version a step samples with, which versions are sent, how stale data is.

Versions count trainer steps: after train step ``t`` of a stage that started at version ``v0``, the
published weights are version ``v0 + t`` (published every ``k = sync_interval`` steps, and after the
last step). Explore step ``s`` (1-based) samples with weights of at least version
``v0 + k * floor((s - 1 - o) / k)`` (``o = sync_offset``): ``o = 0, k = 1`` is strictly on-policy, a large
``o`` fully asynchronous. An experience's staleness at train step ``t`` is ``(v0 + t - 1) - version``.

Everything here is arithmetic on ints and experience versions: the loops of ``launch/`` and every
``WeightSync`` method share it, so the two sides of a sync agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SyncPlan", "is_sync_step", "required_version", "staleness_filter", "versions_needed"]


@dataclass(frozen=True)
class SyncPlan:
    """What a trainer's side knows of a stage before it starts: a sync method that pairs sends with
    receives (collective) derives from it which versions the other side will wait for."""

    total_steps: int
    start_version: int


def is_sync_step(step: int, interval: int, total: int) -> bool:
    """Whether weights are published after train step ``step`` (every ``interval`` steps, and the last)."""
    return step % interval == 0 or step == total


def required_version(step: int, interval: int, offset: int, start: int = 0) -> int:
    """Weights version explore step ``step`` (1-based) must wait for."""
    behind = step - 1 - offset
    return start if behind < 0 else start + interval * (behind // interval)


def versions_needed(total: int, interval: int, offset: int = 0, start: int = 0) -> list[int]:
    """Versions an explorer of ``total`` steps waits for (newer than ``start``), in order.

    A sync method that must pair each send with a receive (collective) sends exactly these, so no send
    waits for a receiver that has already finished."""
    return sorted({required_version(s, interval, offset, start) for s in range(1, total + 1)} - {start})


def staleness_filter(
    experiences: Sequence, trainer_version: int, max_staleness: int | None, policy: str
) -> tuple[list, dict[str, float]]:
    """Drop (or keep, by ``policy``) experiences staler than ``max_staleness`` (by ``model_version``, the
    version the step began sampling with: the oldest of its tokens); staleness statistics, per experience
    and per action token."""
    stale = [trainer_version - e.model_version for e in experiences]
    # per action token: a partial rollout's tokens are of the version that sampled each
    tokens = [trainer_version - v for e in experiences for v in e.action_versions()]
    metrics = {
        "staleness/mean": sum(stale) / max(1, len(stale)),
        "staleness/max": float(max(stale, default=0)),
        "staleness/token_mean": sum(tokens) / max(1, len(tokens)),
        "staleness/token_max": float(max(tokens, default=0)),
    }
    if max_staleness is None:
        return list(experiences), metrics
    too_old = [s > max_staleness for s in stale]
    metrics["staleness/over_limit"] = float(sum(too_old))
    if policy == "drop":
        experiences = [e for e, old in zip(experiences, too_old) if not old]
        metrics["staleness/dropped"] = float(sum(too_old))
    return list(experiences), metrics
