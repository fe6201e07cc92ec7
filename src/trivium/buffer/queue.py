"""A bounded, thread-safe FIFO of experiences between the explorer (producer) and the trainer (consumer).

Design decisions:
- Capacity counts experiences, and a ``put`` is all-or-nothing, so the samples of one task (a GRPO group)
  are never split by a full queue. A put waits until its whole list fits; one larger than the capacity
  goes in once the queue is empty instead of waiting forever.
- The bound is the back-pressure that keeps the explorer at most ``capacity`` experiences ahead of the
  trainer (bounded off-policyness). ``put_blocked_s`` says how long producers waited: a large value
  means the trainer is the bottleneck, zero means it is the explorer.
- ``close()`` wakes every waiter: a consumer still gets what is there if it is enough, otherwise
  ``QueueClosed``; a producer gets ``QueueClosed``.

Left out: priorities, sampling from the middle and persistence (replay buffers get their own type).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from trivium.types import Experience

__all__ = ["ExperienceQueue", "QueueClosed"]


class QueueClosed(RuntimeError):
    """The queue was closed while a caller waited on it, or before the call."""


class ExperienceQueue:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ExperienceQueue(capacity={capacity}): capacity must be >= 1 experiences")
        self.capacity = capacity
        self._items: deque[Experience] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.total_put = 0
        self.total_got = 0
        self.put_blocked_s = 0.0  # seconds producers spent waiting for room, summed over calls

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, experiences: Sequence[Experience], timeout: float | None = None) -> None:
        """Append all of ``experiences`` at once, waiting (up to ``timeout`` s) until they fit."""
        k = len(experiences)
        with self._cond:
            start = time.monotonic()
            fits = self._cond.wait_for(
                lambda: self._closed or not self._items or len(self._items) + k <= self.capacity, timeout
            )
            self.put_blocked_s += time.monotonic() - start
            if self._closed:
                raise QueueClosed(
                    f"ExperienceQueue.put of {k} experiences: the queue is closed (put {self.total_put}, "
                    f"got {self.total_got} so far); the trainer side has shut down"
                )
            if not fits:
                raise TimeoutError(
                    f"ExperienceQueue.put of {k} experiences timed out after {timeout} s: "
                    f"{len(self._items)} of {self.capacity} slots are full and nobody took any. "
                    "The trainer is not consuming (stalled or slower than the explorer); raise the timeout "
                    "or the capacity if this is expected"
                )
            self._items.extend(experiences)
            self.total_put += k
            self._cond.notify_all()

    def get(self, n: int, timeout: float | None = None) -> list[Experience]:
        """Take the ``n`` oldest experiences, waiting (up to ``timeout`` s) until there are ``n``.

        ``n`` may exceed the capacity: a producer that puts a whole step at once (the explorer does; a
        step-wise multi-turn step holds more experiences than runs) gets in once the queue is empty. Many
        small puts can never add up to more than the capacity, so such a get would then time out.
        """
        if n < 1:
            raise ValueError(f"ExperienceQueue.get(n={n}): n must be >= 1")
        with self._cond:
            self._cond.wait_for(lambda: self._closed or len(self._items) >= n, timeout)
            if len(self._items) < n:
                have = f"{len(self._items)} queued (put {self.total_put}, got {self.total_got} so far)"
                if self._closed:
                    raise QueueClosed(
                        f"ExperienceQueue.get(n={n}): the queue was closed with only {have}; the explorer "
                        "finished or stopped before producing a full batch"
                    )
                raise TimeoutError(
                    f"ExperienceQueue.get(n={n}) timed out after {timeout} s with {have}. The explorer "
                    f"produced fewer experiences than the trainer asks for: check that it is running and "
                    f"that tasks per step x repeat_times covers the trainer batch of {n}"
                )
            batch = [self._items.popleft() for _ in range(n)]
            self.total_got += n
            self._cond.notify_all()
            return batch

    def close(self) -> None:
        """Refuse further puts and wake every waiter (see the module docstring for what each gets)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
