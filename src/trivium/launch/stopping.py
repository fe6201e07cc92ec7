"""Stopping a run on request: SIGTERM or Ctrl-C ends it at the next step boundary, with a checkpoint.

A scheduler that preempts a job sends SIGTERM; a person presses Ctrl-C. Either way the step in flight
finishes, its checkpoint is written (whatever ``trainer.save_interval`` says) and the run ends with
``RunStopped``, which says how to continue: run the same command again. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)

__all__ = ["RunStopped", "StopRequests"]


class RunStopped(RuntimeError):
    """The run stopped on request after a step whose checkpoint is on disk."""


class StopRequests:
    """Context: SIGTERM and the first SIGINT set ``requested`` (the signal's name) instead of killing the
    process (main thread only: elsewhere nothing is installed and nothing is ever requested)."""

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: now
        self.requested = name
        log.warning("%s: stopping after the current step (its checkpoint will be written)", name)
