"""Environment calls with a time limit, and what happens to a call that overruns it.

A multi-turn workflow calls ``reset`` and ``step`` through ``call_with_timeout``: the call runs in a helper
thread (``threads.call_in_helper``: kept and reused between calls) that the workflow waits for up to
``env_timeout_s``. When it overruns, the episode fails at once
(``EnvTimeoutError``) and the helper thread is told to stop:

- ``EnvStopped`` (a ``BaseException``, so ``except Exception`` in environment code does not swallow it) is
  raised inside the thread (``PyThreadState_SetAsyncExc``). Python delivers it at the thread's next
  bytecode: a loop in Python code (a simulator, a parser, a busy wait, ``time.sleep`` in slices) stops.
- The workflow then calls the environment's ``close()`` (with the same limit): an environment that runs a
  process or holds a socket kills or closes it there, which also ends a step blocked on it.

A task's own deadline (``task_deadline``, set by the explorer from ``explorer.workflow_timeout_s`` or
``explorer.dynamic_timeout``) bounds every environment call of the task as well: a call gets what is left
of it when that is less than ``env_timeout_s``, and fails the same way when it overruns.

What Python cannot interrupt: a thread blocked inside one C call (a long ``time.sleep``, a read from a
socket or pipe without a timeout, a C extension's loop) sees the exception only when that call returns,
and ``close()`` did not end it. Such a thread is left running as a daemon: it holds no lock of the run,
never blocks the run's end, and is listed by ``hung_calls()`` (the stall doctor reports them, the
explorer counts them in ``rollout/hung_env_calls``) until it returns. An environment that can block like
that should use timeouts of its own, or run its work in a subprocess that ``close()`` kills.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trivium import faults
from trivium.models.protocol import TaskCancelled
from trivium.threads import EnvStopped, call_in_helper

__all__ = ["EnvStopped", "EnvTimeoutError", "call_with_timeout", "hung_calls", "task_deadline"]


class EnvTimeoutError(TimeoutError):
    """An environment call did not return within ``env_timeout_s``; its episode fails."""


@dataclass(frozen=True)
class _TaskLimits:
    deadline: float | None  # time.monotonic() by which the task's calls end; None: none
    set_by: str  # what set the deadline, for the error
    cancelled: threading.Event | None  # set when the explorer goes ahead without the task (over-rollout)
    away: Callable[[], contextlib.AbstractContextManager] | None  # the task's worker steps out of batching


# The running task's limits: its environment calls end by them too (set by the explorer, per task).
_TASK: contextvars.ContextVar[_TaskLimits | None] = contextvars.ContextVar(
    "trivium_task_limits", default=None
)


@contextlib.contextmanager
def task_deadline(
    deadline: float | None,
    set_by: str,
    cancelled: threading.Event | None = None,
    away: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> Iterator[None]:
    """Environment calls made inside end by ``deadline`` (``time.monotonic()``; None: no deadline) as well
    as by their own ``timeout_s``, whichever comes first (``explorer.dynamic_timeout``: a hung environment
    costs the task's limit, not the configured worst case); and at once, with ``TaskCancelled``, when
    ``cancelled`` is set (``explorer.over_rollout``: the step went ahead without the task). ``away``: entered
    while a call runs (``BatchingRolloutModel.away``: the other tasks' model calls do not wait for it)."""
    token = _TASK.set(_TaskLimits(deadline, set_by, cancelled, away))
    try:
        yield
    finally:
        _TASK.reset(token)


def _limit(timeout_s: float | None) -> tuple[float | None, str]:
    """The seconds a call may take now and what sets them: its own limit or the task's deadline."""
    limit, why = (timeout_s or None), f"env_timeout_s={timeout_s} s"
    task = _TASK.get()
    if task is not None and task.deadline is not None:
        left = task.deadline - time.monotonic()
        if limit is None or left < limit:
            limit, why = left, f"the task's time limit ({task.set_by})"
    return limit, why


_HUNG: dict[threading.Thread, tuple[str, float]] = {}  # overrun calls: thread -> (what, monotonic start)
_HUNG_LOCK = threading.Lock()
_CANCEL_POLL_S = 0.05  # how often a call of a task that may be cancelled looks at its flag


def call_with_timeout(
    fn: Callable[..., Any], *args: Any, timeout_s: float | None, what: str, fault_site: str | None = None
) -> Any:
    """``fn(*args)`` in a helper thread; ``EnvTimeoutError`` after ``timeout_s`` (None or 0: no limit),
    the thread told to stop (see the module docstring). ``fault_site``: a ``trivium.faults`` site that may
    inject a fault into this call."""
    if fault_site is not None:
        fn = faults.wrap(fault_site, fn, what, limit_s=timeout_s)
    timeout_s, why = _limit(timeout_s)
    task = _TASK.get()
    cancelled = None if task is None else task.cancelled
    if cancelled is not None and cancelled.is_set():
        raise TaskCancelled(f"{what} was not started: the explorer went ahead without this task")
    if timeout_s is None and cancelled is None:
        return fn(*args)
    if timeout_s is not None and timeout_s <= 0:
        raise EnvTimeoutError(f"{what} was not started: the task is past {why}")
    start = time.monotonic()
    call = call_in_helper(fn, *args, name=f"env-{what}")
    end = None if timeout_s is None else start + timeout_s
    with contextlib.nullcontext() if task is None or task.away is None else task.away():
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            if call.wait(left if cancelled is None else min(_CANCEL_POLL_S, left or _CANCEL_POLL_S)):
                break
            if cancelled is not None and cancelled.is_set():
                break
    if not call.finished and call.stop():
        with _HUNG_LOCK:
            _HUNG[call.thread] = (what, start)
        if cancelled is not None and cancelled.is_set():
            raise TaskCancelled(f"{what} was stopped: the explorer went ahead without this task")
        injected = " (an injected hang, faults.env_hang)" if getattr(fn, "injected", "") == "env_hang" else ""
        raise EnvTimeoutError(f"{what} did not return within {why}{injected}")
    call.wait()  # it finished as the time ran out: its result stands
    return call.result()


def hung_calls() -> list[tuple[str, float]]:
    """``(what, seconds since it started)`` of every overrun environment call still running, oldest first."""
    now = time.monotonic()
    with _HUNG_LOCK:
        for thread in [t for t in _HUNG if not t.is_alive()]:
            del _HUNG[thread]
        return sorted(((what, now - start) for what, start in _HUNG.values()), key=lambda x: -x[1])
