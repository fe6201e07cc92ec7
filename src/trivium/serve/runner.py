"""Where the endpoint's generation runs: on two long-lived threads, never on the request threads.

Why: on CPU, every thread that runs torch ops gets its own OpenMP team, and an idle team keeps spinning for
a while. Requests arrive on the server's pool threads, a different one each time; measured with
``benchmarks/endpoint_load.py`` on 2 busy cores, one client alone waited ~3 s per request (teams of earlier
request threads competing with the current one) against 0.16 s with a single torch thread.

- A ``BatchingRolloutModel``'s batches run on a driver thread (``model.driving()`` / ``model.drive``):
  request threads queue their calls and wait, as they did, but never run a batch themselves. Only when
  asked (``drive=True``: serve mode): an endpoint over an explorer's model (the ``openai_agent``
  workflow) leaves the batches to the explorer, which drives them itself during every step (one driver
  at a time).
- Calls that go to the engine directly (a bare engine, or a request with a ``seed``, which is sampled
  alone) run on one executor thread, one at a time (the engine serialises them anyway).

``start()`` / ``close()`` are called by ``OpenAIServer``; an app served some other way runs generation on
its request threads, as before (correct, only slower on CPU).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["Runner"]

log = logging.getLogger(__name__)


class Runner:
    """Runs ``model``'s batches on a driver thread and direct engine calls on an executor thread."""

    def __init__(self, model: Any):
        self.model = model
        self._executor: ThreadPoolExecutor | None = None
        self._driver: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self, drive: bool = False) -> None:
        """Start the executor thread, and with ``drive`` the driver thread of a batching model."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trivium-engine")
        if drive and hasattr(self.model, "driving") and hasattr(self.model, "drive"):
            self._stopping.clear()
            self._driver = threading.Thread(target=self._drive, name="trivium-batches", daemon=True)
            self._driver.start()

    def _drive(self) -> None:
        try:
            with self.model.driving():
                self.model.drive(self._stopping.is_set)
        except RuntimeError as error:  # another thread drives this model: request threads wait for it
            log.warning("the endpoint does not drive the batches of this model: %s", error)

    def direct(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the executor thread (on this thread before ``start``)."""
        if self._executor is None:
            return fn(*args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Stop the driver (waiting requests then run their batches themselves) and the executor."""
        self._stopping.set()
        if self._driver is not None:
            self._driver.join(timeout=60)
            self._driver = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
