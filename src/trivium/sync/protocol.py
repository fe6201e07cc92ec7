"""The one interface of weight movement, from the trainer to rollout models.

The trainer's side calls ``publish(weights, version)`` with ``Trainer.export_weights(sync.wire_dtype)``
after every ``sync_interval`` steps; a rollout model's side calls ``pull(engine, at_least)`` before a step
that needs newer weights (the version arithmetic is in ``versions.py``). Every method verifies what the
receiving engine loaded against the sender's checksum (``weights.check_loaded``).

| method | where the two sides live | publish | pull |
| --- | --- | --- | --- |
| ``memory`` | one process (mode both; a serve or eval engine next to its trainer) | copies into the engine | waits until the version is there |
| ``checkpoint`` | any processes sharing a folder | writes ``v{N}/`` atomically | loads the newest folder, polling |
| ``collective`` | two processes in one torch.distributed group | broadcasts the versions the receiver needs | receives them in order |

Methods are looked up by name in ``SYNC_METHODS`` (``synchronizer.method``), through the same registry
as every other seam; a method class is built with ``from_config(cfg, run_dir, role, engine, plan)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from trivium.registry import Registry

__all__ = ["SYNC_METHODS", "SyncStopped", "WeightSync"]


class SyncStopped(RuntimeError):
    """``pull`` gave up because the sync was closed (the run is ending)."""


class WeightSync(Protocol):
    wire_dtype: torch.dtype | None
    """The dtype the trainer exports its weights in for this method (None: its own)."""

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        """Trainer side: make ``weights`` available as ``version``; returns timing metrics (``sync/*``)."""
        ...

    def publish_start(self, export: Callable[[], Mapping[str, torch.Tensor]], version: int) -> None:
        """Trainer side, once at the start of a stage: publish the starting weights (``export()``) where
        a receiver that starts later needs them (files); a no-op for the other methods."""
        ...

    def pull(self, engine, at_least: int | None = None, timeout_s: float | None = None) -> int | None:
        """Rollout side: load newer weights into ``engine`` if there are any; with ``at_least``, wait until
        the engine holds at least that version (``WeightSyncError`` after ``timeout_s``). Returns the
        version loaded by this call, or None."""
        ...

    def close(self) -> None: ...


SYNC_METHODS = Registry(
    "weight sync method",
    doc="a class with from_config(cfg, run_dir, role: 'trainer' | 'rollout', engine, plan) -> WeightSync",
    builtins=["trivium.sync.builtin"],  # memory, checkpoint, collective
)


def build_weight_sync(cfg, run_dir: Path, role: str, engine: Any = None, plan: Any = None) -> WeightSync:
    """The stage's ``synchronizer.method`` for one side (``role``: 'trainer' or 'rollout'); ``engine``: the
    rollout model of this process (memory, and the rollout side); ``plan``: ``versions.SyncPlan``."""
    return SYNC_METHODS.get(cfg.synchronizer.method).from_config(cfg, Path(run_dir), role, engine, plan)
