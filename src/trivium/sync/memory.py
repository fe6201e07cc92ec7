"""Weight sync within one process: the trainer copies its weights into the rollout model it drives.

``publish`` copies (``engine.update_weights``; the engine's lock keeps it out of a running batch, or with
``explorer.rollout.in_flight_updates`` the running batch loads it at its next token),
verifies the engine's checksum against the sent weights when ``verify`` is on (not for an engine that
samples from the trainer's own tensors, ``launch/build.py``'s "share": nothing is copied, only the version
moves; the record says ``sync/shared_weights``), and wakes any explorer thread that waits in ``pull`` for
that version (mode both with ``sync_offset > 0``: the explorer runs ahead
in its own thread, see ``launch/overlap.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import torch

from trivium.models.weights import WeightSyncError, check_finite, check_loaded, weights_checksum
from trivium.sync.protocol import SyncStopped

__all__ = ["MemorySync"]


class MemorySync:
    wire_dtype: torch.dtype | None = None  # the engine casts on load

    def __init__(self, engine, verify: bool = True):
        self.engine = engine
        self.verify = verify
        self._cv = threading.Condition()
        self._closed = False

    @classmethod
    def from_config(cls, cfg, run_dir, role: str, engine, plan=None) -> MemorySync:
        if engine is None:
            raise ValueError("synchronizer.method memory needs the rollout model of this process")
        return cls(engine, verify=cfg.synchronizer.verify_checksum)

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        check_finite(weights, version, "publishing in memory")
        holds = getattr(self.engine, "holds_weights", None)
        shared = holds is not None and holds(weights)  # an engine over the trainer's own tensors
        self.engine.update_weights(weights, version)
        metrics = {"sync/seconds": time.perf_counter() - t0}
        if shared:  # nothing was copied: nothing to verify (two checksums: ~3 s a sync at 0.5B parameters)
            metrics["sync/shared_weights"] = 1.0
        elif self.verify:  # the engine may hold another dtype (explorer.rollout.dtype): compare cast weights
            expected = weights_checksum(weights, self.engine.weights_dtype)
            check_loaded(self.engine, expected, version, "the trainer (in memory)")
            metrics["sync/checksum_seconds"] = time.perf_counter() - t0 - metrics["sync/seconds"]
        with self._cv:
            self._cv.notify_all()
        return metrics

    def publish_start(self, export, version: int) -> None:
        """Nothing to do: the engine was built from the trainer's starting weights."""

    def pull(self, engine=None, at_least: int | None = None, timeout_s: float | None = None) -> int | None:
        """Wait until the engine holds ``at_least`` (published by the trainer thread); loads nothing."""
        if at_least is None:
            return None
        with self._cv:
            arrived = self._cv.wait_for(
                lambda: self._closed or self.engine.version >= at_least, timeout=timeout_s
            )
            if self._closed:
                raise SyncStopped(f"stopped while waiting for weights version {at_least}")
        if not arrived:
            raise WeightSyncError(
                f"waited {timeout_s:.0f} s for weights version {at_least} (the rollout model has "
                f"{self.engine.version}): the trainer has not published it"
            )
        return None

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
