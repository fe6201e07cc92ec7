"""Merge concurrent ``generate`` calls from many workflow threads into one batched engine call.

Workflows run in threads and each asks for n samples of one prompt; the engine is fastest on one big batch.
This wrapper queues requests and, when a batch *fires*, runs one engine call per distinct
``SamplingParams``, then hands every caller its own slice.

Firing rule (deterministic, no polling):
- A thread declares itself a worker with ``with batching.worker():``. The batch fires as soon as every
  worker is blocked in ``generate``: then no new request can arrive, so waiting longer gains nothing.
- Requests from threads outside any worker context fire after at most ``max_wait_s``.
- Workers that start late would otherwise miss a batch (a thread pool starts threads one by one). A
  dispatcher that is about to start ``total`` workers at most ``concurrency`` at a time declares them with
  ``with batching.expect_workers(total, concurrency):``; slots not yet claimed by a ``worker()`` then count as
  workers that will call ``generate``, so batch membership no longer depends on thread timing. A slot that
  is never claimed (a task that failed before entering ``worker()``) holds a batch back for at most
  ``late_worker_grace_s``; then the batch fires anyway, with a warning, instead of deadlocking.
- Inside a fired batch, requests are ordered by ``order_key`` (then arrival), so the engine sees the same
  batch in the same order for a fixed seed, and samples are reproducible.

Any thread may run the engine for a fired batch (the one that found it ready); others wait on a condition.
While a thread is inside ``drive()``, that thread alone runs the batches (see ``drive`` for why).
Engine errors are re-raised in every caller of the failing engine call.

Left out on purpose: a background thread, priorities and batch-size limits (the engine takes the whole batch).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trivium.models.protocol import Generation, RolloutModel, SamplingParams, TaskCancelled

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedTokenizerBase

    from trivium.models.vision import PromptImages, VisionProcessor

__all__ = ["BatchingRolloutModel"]

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompts: list[list[int]]
    media: list[PromptImages | None] | None  # the prompts' images (vision-language models), or None
    params: SamplingParams
    order_key: Any
    arrival: int
    from_worker: bool
    deadline: float  # monotonic seconds; only used for requests from non-workers
    result: list[list[Generation]] | None = None
    error: BaseException | None = None
    done: bool = False

    def sort_key(self) -> tuple:
        # Keyed requests first, by key; unkeyed ones after, by arrival. Keys are only compared to keys.
        return (0, self.order_key, self.arrival) if self.order_key is not None else (1, 0, self.arrival)


@dataclass
class _Reservation:
    pending: int  # worker slots announced but not yet claimed by a worker() entry
    concurrency: int  # at most this many of them run at once
    claimed_threads: set[int] = field(default_factory=set)


class BatchingRolloutModel:
    """``RolloutModel`` wrapper that batches concurrent callers; see the module docstring for the rules."""

    def __init__(self, engine: RolloutModel, *, max_wait_s: float = 0.05, late_worker_grace_s: float = 1.0):
        if max_wait_s < 0 or late_worker_grace_s < 0:
            raise ValueError(
                f"BatchingRolloutModel: max_wait_s={max_wait_s} and late_worker_grace_s={late_worker_grace_s} "
                "must be >= 0 seconds"
            )
        self.engine = engine
        self.max_wait_s = max_wait_s  # callers outside worker(): longest wait for others to join a batch
        self.late_worker_grace_s = late_worker_grace_s  # announced workers: longest wait for one to start
        self.engine_calls = 0  # engine.generate calls made
        self.engine_seconds = 0.0  # wall time inside engine.generate, all calls (the rollout profile)
        self.requests = 0  # generate calls received
        self._cv = threading.Condition()
        self._local = threading.local()
        self._arrivals = itertools.count()
        self._pending: list[_Request] = []
        self._busy = False  # a thread is running the engine
        self._workers = 0  # threads inside worker()
        self._blocked = 0  # of those, threads inside generate whose request is not yet answered
        self._reservation: _Reservation | None = None
        self._held_since: float | None = None  # all running workers blocked, waiting only for announced ones
        self._driver: int | None = None  # thread id running every batch (see drive()), or None

    # ------------------------------------------------------------------------------------ RolloutModel
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.engine.tokenizer

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def vision(self) -> VisionProcessor | None:
        """The engine's image processor and store (vision-language models), else None."""
        return getattr(self.engine, "vision", None)

    @property
    def max_length(self) -> int | None:
        """The engine's context in tokens (prompt + response), when it says."""
        return getattr(self.engine, "max_length", None)

    @property
    def eos_ids(self) -> set[int] | None:
        """Token ids that end a response, when the engine says."""
        return getattr(self.engine, "eos_ids", None)

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        self.engine.update_weights(state_dict, version)  # between batches, or in flight (the engine's choice)

    def state_dict(self) -> dict[str, Tensor]:
        return self.engine.state_dict()

    def holds_weights(self, state_dict: Mapping[str, Tensor]) -> bool:
        """Whether ``state_dict``'s tensors are the engine's own (an in-process engine over the trainer's
        weights); False for engines that keep weights in memory of their own (vLLM, Ray actors)."""
        holds = getattr(self.engine, "holds_weights", None)
        return holds is not None and holds(state_dict)

    @property
    def weights_dtype(self):
        return self.engine.weights_dtype

    def weights_checksum(self) -> str:
        return self.engine.weights_checksum()

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        order_key: Any = None,
        media: Sequence[PromptImages | None] | None = None,
    ) -> list[list[Generation]]:
        """Queue the request, wait until its batch has run, return this caller's generations.

        ``order_key`` (any value comparable with the other callers' keys, e.g. ``(task_index, run)``) fixes
        this request's place in its batch; without it, arrival order is used. ``media[i]``: the images of
        ``prompts[i]`` (see ``TransformersEngine.generate``).
        """
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        if media is not None and len(media) != len(prompts):
            raise ValueError(f"generate(): {len(media)} media entries for {len(prompts)} prompts")
        from_worker = self._depth() > 0
        with self._cv:
            self.requests += 1
            request = _Request(
                prompts,
                None if media is None or all(m is None for m in media) else list(media),
                params,
                order_key,
                arrival=next(self._arrivals),
                from_worker=from_worker,
                deadline=time.monotonic() + self.max_wait_s,
            )
            self._pending.append(request)
            if from_worker:
                self._blocked += 1
            self._cv.notify_all()  # a driver thread may be waiting for work
            while not request.done:
                if self._driver is None and self._ready():
                    self._run_batch()
                else:
                    self._cv.wait(timeout=self._wait_timeout())
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        """Make the calling thread the only one that runs batches, for the duration; see ``drive``.

        Enter it before starting the workers (so that none of them runs a batch first) and leave it
        before waiting for them (on leaving, waiting workers run their batches themselves again).

        Why: on CPU, torch ops called from a second thread get a second OpenMP team that competes with the
        first one's spinning workers; measured on 2 cores, the same decode batch took 1.7x longer from a
        worker thread than from the main thread, which also trains.
        """
        with self._cv:
            if self._driver is not None:
                raise RuntimeError(
                    "driving() is already active in another thread: one driver at a time, no driver may nest"
                )
            self._driver = threading.get_ident()
        try:
            yield
        finally:
            with self._cv:
                self._driver = None
                self._cv.notify_all()

    def drive(self, done: Callable[[], bool], poll_s: float = 0.002) -> None:
        """Inside ``driving()``: run every ready batch on this thread until ``done()`` is true."""
        with self._cv:
            if self._driver != threading.get_ident():
                raise RuntimeError("drive() must be called by the thread inside driving()")
            while not done():
                if self._ready():
                    self._run_batch()
                else:
                    deadline = self._time_to_deadline()
                    self._cv.wait(timeout=poll_s if deadline is None else min(poll_s, deadline))

    def cancel(self, order_keys: Collection[Any]) -> int:
        """Answer the pending requests of ``order_keys`` with ``TaskCancelled`` (a request already in a
        running batch completes); returns how many were cancelled."""
        keys = set(order_keys)
        with self._cv:
            gone = [r for r in self._pending if r.order_key in keys]
            if not gone:
                return 0
            self._pending = [r for r in self._pending if r.order_key not in keys]
            for r in gone:
                r.error = TaskCancelled(f"task {r.order_key}: the explorer went ahead without it")
                r.done = True
                if r.from_worker:
                    self._blocked -= 1
            self._cv.notify_all()
        return len(gone)

    # ------------------------------------------------------------------------------------ worker contexts
    @contextlib.contextmanager
    def worker(self) -> Iterator[None]:
        """Mark the calling thread as a worker for the duration (re-entrant; nested entries count once)."""
        depth = self._depth()
        self._local.depth = depth + 1
        if depth == 0:
            with self._cv:
                self._workers += 1
                reservation = self._reservation
                if reservation is not None and reservation.pending > 0:
                    reservation.pending -= 1
                    reservation.claimed_threads.add(threading.get_ident())
                    self._held_since = None  # an announced worker arrived: restart the grace period
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cv:
                    self._workers -= 1
                    if self._reservation is not None:
                        self._reservation.claimed_threads.discard(threading.get_ident())
                    self._cv.notify_all()  # the others may now all be blocked

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        """A worker steps out of the batch count for the duration (a long environment call): batches fire
        without waiting for it to call ``generate``. Its requests then join whichever batch is forming when
        it comes back, so batch membership depends on timing (the explorer uses it with over-rollout only,
        where a step goes ahead on timing anyway)."""
        if self._depth() == 0:
            yield
            return
        with self._cv:
            self._workers -= 1
            self._cv.notify_all()  # the others may now all be blocked
        try:
            yield
        finally:
            with self._cv:
                self._workers += 1

    @contextlib.contextmanager
    def expect_workers(self, total: int, concurrency: int | None = None) -> Iterator[None]:
        """Announce ``total`` workers about to start, at most ``concurrency`` at a time (default: all).

        Until a thread claims a slot by entering ``worker()``, the slot counts as a worker that will call
        ``generate``, as long as fewer than ``concurrency`` claimed workers are running. Use it around a
        thread pool of ``max_workers=concurrency`` whose every task enters ``worker()``; a slot never
        claimed holds batches back until the context exits or for ``late_worker_grace_s``, whichever comes
        first. One reservation at a time.
        """
        if total < 0 or (concurrency is not None and concurrency < 1):
            raise ValueError(
                f"expect_workers(total={total}, concurrency={concurrency}): need total >= 0, concurrency >= 1"
            )
        with self._cv:
            if self._reservation is not None:
                raise RuntimeError(
                    "expect_workers() is already active; run one reservation at a time (e.g. rollout and "
                    "eval tasks of a step in one reservation)"
                )
            self._reservation = _Reservation(pending=total, concurrency=concurrency or max(total, 1))
        try:
            yield
        finally:
            with self._cv:
                self._reservation = None
                self._cv.notify_all()

    # ------------------------------------------------------------------------------------ internals
    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _expected_workers(self) -> int:
        """Workers that are running, plus announced ones that have a free slot to start in."""
        r = self._reservation
        if r is None:
            return self._workers
        running = len(r.claimed_threads)
        return self._workers + min(r.pending, max(0, r.concurrency - running))

    def _ready(self) -> bool:
        """Whether the pending requests should run now (the firing rule); tracks ``_held_since``."""
        if self._busy or not self._pending:
            return False
        now = time.monotonic()
        if any(not r.from_worker and r.deadline <= now for r in self._pending):
            return True
        if self._workers == 0 or self._blocked < self._workers:
            self._held_since = None
            return False
        if self._blocked >= self._expected_workers():
            return True
        # Every running worker is blocked; only announced, not yet started workers are missing.
        if self._held_since is None:
            self._held_since = now
        if now - self._held_since < self.late_worker_grace_s:
            return False
        log.warning(
            "BatchingRolloutModel: %d announced worker(s) did not start within %.1fs; running the batch without "
            "them (announce only workers that will enter worker(), or leave expect_workers() earlier)",
            self._expected_workers() - self._blocked,
            self.late_worker_grace_s,
        )
        return True

    def _wait_timeout(self) -> float | None:
        """How long a caller waits before looking again. While a batch runs, or while a driver thread runs
        the batches, nothing it could do changes until it is notified (the batch's end, or its own request
        done): it waits for that. Waking at a passed deadline instead returned at once, over and over: a
        few dozen callers spinning for the lock and the GIL starved the batch that they waited for (an
        endpoint under load answered small requests after ~60 s instead of ~2 s)."""
        if self._busy or self._driver is not None:
            return None
        return self._time_to_deadline()

    def _time_to_deadline(self) -> float | None:
        deadlines = [r.deadline for r in self._pending if not r.from_worker]
        if self._held_since is not None:
            deadlines.append(self._held_since + self.late_worker_grace_s)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _run_batch(self) -> None:
        """Take every pending request, run the engine without holding the lock, deliver results.

        Called with ``self._cv`` held; returns with it held. Results are written under the lock, together
        with the ``_blocked`` count, so no waiter ever sees one without the other.
        """
        batch = sorted(self._pending, key=_Request.sort_key)
        self._pending = []
        self._held_since = None
        self._busy = True
        outcomes: list[tuple[list[_Request], list[list[Generation]] | Exception]] = []
        self._cv.release()
        t0 = time.perf_counter()
        try:
            for params, group in _by_params(batch):
                outcomes.append((group, self._call_engine(params, group)))
        finally:
            self._cv.acquire()
            self.engine_seconds += time.perf_counter() - t0
            for group, outcome in outcomes:
                start = 0
                for r in group:
                    if isinstance(outcome, Exception):
                        r.error = outcome
                    else:
                        r.result = outcome[start : start + len(r.prompts)]
                        start += len(r.prompts)
                    r.done = True
            for r in batch:
                if not r.done:  # the leader itself was interrupted (e.g. KeyboardInterrupt)
                    r.error = RuntimeError("batched generate was interrupted before this request ran")
                    r.done = True
                if r.from_worker:
                    self._blocked -= 1
            self._busy = False
            self._cv.notify_all()

    def _call_engine(
        self, params: SamplingParams, group: list[_Request]
    ) -> list[list[Generation]] | Exception:
        """One engine call for ``group``; an exception is returned, to be raised in each of its callers."""
        prompts = [p for r in group for p in r.prompts]
        self.engine_calls += 1
        try:
            if any(r.media is not None for r in group):  # only engines that take images see the argument
                media = [m for r in group for m in (r.media or [None] * len(r.prompts))]
                results = self.engine.generate(prompts, params, media=media)
            else:
                results = self.engine.generate(prompts, params)
        except Exception as e:
            return e
        if len(results) != len(prompts):
            return RuntimeError(f"engine returned {len(results)} results for {len(prompts)} prompts")
        return results


def _by_params(batch: list[_Request]) -> list[tuple[SamplingParams, list[_Request]]]:
    """Requests grouped by sampling params; groups in order of their first (already sorted) request."""
    groups: dict[SamplingParams, list[_Request]] = {}
    for r in batch:
        groups.setdefault(r.params, []).append(r)
    return list(groups.items())
