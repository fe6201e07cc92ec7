"""Where a step's time goes: seconds per phase, logged as ``time/<phase>`` in every step's record.

The phases (docs/performance.md): ``rollout`` (split into ``rollout_generate``, in the engine, and
``rollout_reward``, outside it), ``collate``, ``old_logprobs``, ``ref_logprobs``, ``teacher_logprobs``,
``values``, ``advantages``, ``forward_backward``, ``optimizer``, ``critic``, ``train`` (the whole train
step), ``sync``, ``eval``, ``checkpoint``, ``step`` (the loop's whole step) and ``idle`` (``step`` minus
the phases the loop saw: waits for the explorer thread or a buffer, logging, bookkeeping).

On CUDA, kernels run asynchronously: a phase synchronises the device at its ends so that its seconds are
its own (a few microseconds a phase).

Memory (``monitor.phase_memory: true``, Linux): every phase also logs ``rss/<phase>``, the process's peak
resident memory (MB) while the phase ran (``PeakRss``). It resets the kernel's high-water mark of the
process at each phase start, which other readers of that mark (``VmHWM``, ``getrusage``'s ``ru_maxrss``)
then see, hence off by default; ``train/peak_rss_mb`` stays the peak of the whole process either way
(``PeakRss.process_peak``). It is process-wide: with an explorer thread (``sync_offset`` > 0) a phase's
peak includes what the other half held at the time. GPU memory per phase is not logged.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Iterator

__all__ = ["PEAK_RSS", "PREFIX", "RSS_PREFIX", "PeakRss", "PhaseTimer", "close_step"]

PREFIX = "time/"
RSS_PREFIX = "rss/"


class PeakRss:
    """The peak resident memory of this process during phases that may nest and overlap (threads).

    Linux keeps one high-water mark per process (``VmHWM``), which ``/proc/self/clear_refs`` resets. A
    phase's start folds the mark so far into every open phase (and the process's lifetime peak), then
    resets it; its end takes the larger of its running peak and the mark. So nested and concurrent phases
    each get the peak of their own span. Off until ``enable(True)`` (``monitor.phase_memory``); where
    ``/proc`` cannot be read or written, ``enable`` says so and it stays off.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[int, float] = {}  # token -> running peak (MB) of an open phase
        self._ids = itertools.count()
        self._lifetime = 0.0  # the marks read before each reset: the process's peak across resets
        self.enabled = False

    def enable(self, on: bool) -> bool:
        """Turn per-phase peaks on or off; returns whether they are on (False where /proc cannot do it)."""
        with self._lock:
            mark = self._status()
            self.enabled = bool(on) and mark is not None and self._reset(mark)
            return self.enabled

    def _reset(self, mark: float) -> bool:
        """Reset the kernel's mark, keeping ``mark`` (its value now) in the lifetime peak."""
        self._lifetime = max(self._lifetime, mark)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak resident set size to the current one
            return True
        except OSError:
            return False

    @staticmethod
    def _status() -> float | None:
        """``VmHWM`` in MB (the peak since the last reset), or None."""
        try:
            with open("/proc/self/status") as f:
                found = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.MULTILINE)
        except OSError:
            return None
        return int(found.group(1)) / 1024 if found else None

    def process_peak(self) -> float:
        """The peak RSS of the whole process so far (MB), whether phases reset the kernel's mark or not."""
        import resource

        with self._lock:
            maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
            return max(self._lifetime, self._status() or 0.0, maxrss)

    def start(self) -> int | None:
        if not self.enabled:
            return None
        with self._lock:
            self._reset(self._fold())
            token = next(self._ids)
            self._open[token] = 0.0  # the mark, reset to the RSS of now, is read at its end
            return token

    def stop(self, token: int | None) -> float | None:
        """The phase's peak RSS in MB (None when not measured)."""
        if token is None:
            return None
        with self._lock:
            self._fold()
            return self._open.pop(token)

    def _fold(self) -> float:
        """The mark so far into every open phase's running peak (before a reset would lose it); returns it."""
        mark = self._status() or 0.0
        for token in self._open:
            self._open[token] = max(self._open[token], mark)
        return mark

    @contextlib.contextmanager
    def phase(self, record: dict, name: str) -> Iterator[None]:
        """Measure the block; writes ``rss/<name>`` into ``record`` (the larger, when already there)."""
        token = self.start()
        try:
            yield
        finally:
            peak = self.stop(token)
            if peak is not None:
                key = RSS_PREFIX + name
                record[key] = max(record.get(key, 0.0), peak)


PEAK_RSS = PeakRss()  # one per process: the high-water mark it resets is the process's


class PhaseTimer:
    """Adds up the seconds of named phases; ``metrics()`` gives them as ``time/<phase>``."""

    def __init__(self, device=None):
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}  # rss/<phase>: MB
        self._cuda = device is not None and getattr(device, "type", str(device)) == "cuda"

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        try:
            with PEAK_RSS.phase(self.peaks, phase):
                yield
        finally:
            self._sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    def metrics(self) -> dict[str, float]:
        return {**{PREFIX + k: v for k, v in self.seconds.items()}, **self.peaks}


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
