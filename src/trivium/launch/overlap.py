"""Explorer and trainer overlapping in one process: the explorer thread runs ahead by ``sync_offset`` steps.

The synchronous loop (``sync_offset: 0``) alternates explore → train → sync on one thread. With an offset,
the explorer runs in its own thread and the trainer (this thread) consumes its batches in step order:

- Explore step ``s`` may start once the rollout weights are at least version
  ``k * floor((s - 1 - o) / k)`` (k = sync_interval, o = sync_offset): o = 0, k = 1 is strictly on-policy;
  a large o is fully asynchronous (the bounded queue then limits how far ahead the explorer gets).
- Weights are pushed after every k-th train step; the engine's lock keeps a push out of a running batch.
- Every experience carries the version that sampled it; at train step t its staleness is (t − 1) − version.
  Experiences staler than ``max_staleness`` are dropped or kept, by policy, and counted either way.
- Evaluation runs on the explorer thread between its steps (the engine serves one batch at a time) with
  the newest weights, and writes its own metrics record.
"""

from __future__ import annotations

import logging
import queue as queue_lib
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class VersionGate:
    """The newest weights version pushed to the rollout model; explore steps wait on it."""

    def __init__(self, version: int = 0):
        self.version = version
        self._cv = threading.Condition()
        self._stopped = False

    def publish(self, version: int) -> None:
        with self._cv:
            self.version = version
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def wait_for(self, version: int) -> bool:
        """Block until ``version`` is published; False if stopped first."""
        with self._cv:
            self._cv.wait_for(lambda: self._stopped or self.version >= version)
            return not self._stopped


def required_version(step: int, interval: int, offset: int, start: int = 0) -> int:
    """Weights version explore step ``step`` (1-based) must wait for."""
    behind = step - 1 - offset
    return start if behind < 0 else start + interval * (behind // interval)


def staleness_filter(
    experiences: list, trainer_version: int, max_staleness: int | None, policy: str
) -> tuple[list, dict[str, float]]:
    """Drop (or keep, by ``policy``) experiences staler than ``max_staleness``; staleness statistics."""
    stale = [trainer_version - e.model_version for e in experiences]
    metrics = {
        "staleness/mean": sum(stale) / max(1, len(stale)),
        "staleness/max": float(max(stale, default=0)),
    }
    if max_staleness is None:
        return experiences, metrics
    too_old = [s > max_staleness for s in stale]
    metrics["staleness/over_limit"] = float(sum(too_old))
    if policy == "drop":
        experiences = [e for e, old in zip(experiences, too_old) if not old]
        metrics["staleness/dropped"] = float(sum(too_old))
    return experiences, metrics


class ExplorerThread:
    """Runs ``explorer.explore_step`` for steps done+1..total in a thread, each when the gate allows it."""

    def __init__(
        self,
        explorer,
        gate: VersionGate,
        steps: tuple[int, int],  # (done, total): done > 0 when resuming
        interval: int,
        offset: int,
        start_version: int,
        on_eval: Callable[[dict[str, Any]], None],
    ):
        self.explorer = explorer
        self.gate = gate
        (self.done, self.total), self.interval, self.offset = steps, interval, offset
        self.start_version = start_version
        self.on_eval = on_eval
        self.results: queue_lib.Queue = queue_lib.Queue()  # (step, metrics) or (step, exception)
        self._eval_requests: queue_lib.Queue = queue_lib.Queue()
        self._thread = threading.Thread(target=self._run, name="explorer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request_eval(self, step: int) -> None:
        self._eval_requests.put(step)

    def join(self) -> None:
        self._thread.join()
        self._serve_evals()  # requests that arrived after the last explore step

    def _serve_evals(self) -> None:
        while True:
            try:
                step = self._eval_requests.get_nowait()
            except queue_lib.Empty:
                return
            self.on_eval(
                {"step": step, "eval_model_version": self.explorer.model.version, **self.explorer.evaluate()}
            )

    def _run(self) -> None:
        for step in range(self.done + 1, self.total + 1):
            try:
                if not self.gate.wait_for(
                    required_version(step, self.interval, self.offset, self.start_version)
                ):
                    return
                self._serve_evals()
                metrics = self.explorer.explore_step(step)
                # the explorer's state right after this step: what a checkpoint of train step `step` records
                self.results.put((step, (metrics, self.explorer.state_dict())))
            except BaseException as exc:  # the trainer thread re-raises it
                self.results.put((step, exc))
                return

    def next_result(self, step: int) -> tuple[dict[str, float], dict]:
        """``(metrics, explorer state right after the step)`` of explore step ``step``."""
        got, result = self.results.get()
        if isinstance(result, BaseException):
            raise RuntimeError(f"the explorer thread failed at explore step {got}") from result
        if got != step:
            raise RuntimeError(f"explore step {got} arrived while the trainer expected {step}")
        return result
