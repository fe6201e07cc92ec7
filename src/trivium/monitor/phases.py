"""Where a step's time goes: seconds per phase, logged as ``time/<phase>`` in every step's record.

The phases (docs/performance.md): ``rollout`` (split into ``rollout_generate``, in the engine, and
``rollout_reward``, outside it), ``collate``, ``old_logprobs``, ``ref_logprobs``, ``teacher_logprobs``,
``values``, ``advantages``, ``forward_backward``, ``optimizer``, ``critic``, ``train`` (the whole train
step), ``sync``, ``eval``, ``checkpoint``, ``step`` (the loop's whole step) and ``idle`` (``step`` minus
the phases the loop saw: waits for the explorer thread or a buffer, logging, bookkeeping).

On CUDA, kernels run asynchronously: a phase synchronises the device at its ends so that its seconds are
its own (a few microseconds a phase).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["PREFIX", "PhaseTimer", "close_step"]

PREFIX = "time/"


class PhaseTimer:
    """Adds up the seconds of named phases; ``metrics()`` gives them as ``time/<phase>``."""

    def __init__(self, device=None):
        self.seconds: dict[str, float] = {}
        self._cuda = device is not None and getattr(device, "type", str(device)) == "cuda"

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    def metrics(self) -> dict[str, float]:
        return {PREFIX + k: v for k, v in self.seconds.items()}


def close_step(record: dict, step_seconds: float, source_seconds: float) -> None:
    """Add ``time/step`` and ``time/idle`` to a step's ``record``.

    ``source_seconds``: the loop's wait for the step's batch, which holds the inline rollout (busy) and
    ``time/wait`` (for an explorer thread or process, or a buffer: idle). Idle is what the step's wall
    time leaves after the busy parts (the batch, ``train``, ``sync``, ``eval``), i.e. the waits plus the
    loop's own bookkeeping (metrics, logging)."""
    busy = source_seconds - record.get(PREFIX + "wait", 0.0)
    busy += sum(record.get(PREFIX + k, 0.0) for k in ("train", "sync", "eval"))
    record[PREFIX + "step"] = step_seconds
    record[PREFIX + "idle"] = max(0.0, step_seconds - busy)
