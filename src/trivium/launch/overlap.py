"""Explorer and trainer overlapping in one process: the explorer thread runs ahead by ``sync_offset`` steps.

The synchronous loop (``sync_offset: 0``) alternates explore → train → sync on one thread. With an offset,
the explorer runs in its own thread and the trainer (the loop's thread) consumes its batches in step order:

- Explore step ``s`` starts once the rollout weights are at least ``required_version(s, k, o)`` (see
  ``sync/versions.py``; the loop is ``launch/explore_steps.py``'s, shared with a decoupled run's explore
  process): the thread waits in ``MemorySync.pull``, which the trainer's ``publish`` wakes.
  A large offset is fully asynchronous (the bounded queue then limits how far ahead the explorer gets).
- The engine's lock keeps a weight update out of a running batch; with ``explorer.rollout.in_flight_updates``
  (partial rollouts) the running batch takes the update at its next token instead, so the trainer's sync
  does not wait for the explorer's longest generation.
- Evaluation runs on the explorer thread between its steps (the engine serves one batch at a time) with
  the newest weights, and writes its own metrics record.
"""

from __future__ import annotations

import logging
import queue as queue_lib
import threading
from collections.abc import Callable
from typing import Any

from trivium.launch.explore_steps import Pacing, explore_steps
from trivium.sync.protocol import SyncStopped

log = logging.getLogger(__name__)

__all__ = ["ExplorerThread"]


class ExplorerThread:
    """Runs ``explorer.explore_step`` for steps done+1..total in a thread, each once its weights are there."""

    def __init__(
        self,
        explorer,
        sync,  # MemorySync into explorer.model: pull(engine, at_least) waits for a version
        steps: tuple[int, int],  # (done, total): done > 0 when resuming
        interval: int,
        offset: int,
        start_version: int,
        on_eval: Callable[[dict[str, Any]], None],
    ):
        self.explorer = explorer
        self.sync = sync
        (self.done, self.total), self.interval, self.offset = steps, interval, offset
        self.start_version = start_version
        self.on_eval = on_eval
        self.results: queue_lib.Queue = queue_lib.Queue()  # (step, (metrics, state)) or (step, exception)
        self._eval_requests: queue_lib.Queue = queue_lib.Queue()
        self._thread = threading.Thread(target=self._run, name="explorer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request_eval(self, step: int) -> None:
        self._eval_requests.put(step)

    def stop(self) -> None:
        """Stop waiting for weights, let the thread end, and serve the evaluations still asked for."""
        self.sync.close()
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
        pacing = Pacing(self.interval, self.offset, self.start_version)
        running = self.done + 1  # the step an exception belongs to
        try:
            for step, metrics in explore_steps(
                self.explorer, self.sync, range(self.done + 1, self.total + 1), pacing, self._serve_evals
            ):
                # the explorer's state right after this step: what a checkpoint of train step `step` records
                self.results.put((step, (metrics, self.explorer.state_dict())))
                running = step + 1
        except SyncStopped:
            return
        except BaseException as exc:  # the trainer thread re-raises it
            self.results.put((running, exc))

    def next_result(self, step: int) -> tuple[dict[str, float], dict]:
        """``(metrics, explorer state right after the step)`` of explore step ``step``."""
        got, result = self.results.get()
        if isinstance(result, BaseException):
            raise RuntimeError(f"the explorer thread failed at explore step {got}") from result
        if got != step:
            raise RuntimeError(f"explore step {got} arrived while the trainer expected {step}")
        return result
