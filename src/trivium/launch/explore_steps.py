"""The one explore loop: explore steps ``first..total``, each once the rollout weights it needs are there.

Every placement of the explorer runs its steps through ``explore_steps``: the explorer thread of an
overlapped run (``launch/overlap.py``, ``sync_offset > 0``) and the explore process of a decoupled run
(``launch/decoupled.py``). Explore step ``s`` first waits in ``WeightSync.pull`` for the version
``required_version(s, k, o, start)`` (``sync/versions.py``), then samples; the seconds it waited are in its
record as ``sync/wait_seconds``. What happens to a step's record (a queue to the trainer's thread, a metrics
file and a state file) is the caller's, so the pacing is written once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trivium.sync.versions import required_version

__all__ = ["Pacing", "explore_steps"]


@dataclass(frozen=True)
class Pacing:
    """Which weights explore step ``s`` waits for: ``required_version(s, interval, offset, start_version)``."""

    interval: int  # synchronizer.sync_interval
    offset: int  # synchronizer.sync_offset (0 in a decoupled run: its train process publishes as it goes)
    start_version: int  # the weights version the stage starts from


def explore_steps(
    explorer,
    sync,  # a WeightSync whose pull(engine, at_least) loads the rollout weights; None: never wait
    steps: range,
    pacing: Pacing,
    before_step: Callable[[], None] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields ``(step, record)`` for each explore step of ``steps``, in order, each sampled with weights of
    at least the version ``pacing`` names; ``before_step`` runs after the wait (an overlapped run serves its
    evaluation requests there, with the newest weights)."""
    for step in steps:
        t0 = time.monotonic()
        if sync is not None:
            need = required_version(step, pacing.interval, pacing.offset, pacing.start_version)
            sync.pull(explorer.model, at_least=need)
        waited = time.monotonic() - t0
        if before_step is not None:
            before_step()
        record = explorer.explore_step(step)
        record["sync/wait_seconds"] = waited
        yield step, record
