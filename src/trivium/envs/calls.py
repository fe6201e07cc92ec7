"""Environment calls with a time limit, and what happens to a call that overruns it.

A multi-turn workflow calls ``reset`` and ``step`` through ``call_with_timeout``: the call runs in a helper
thread that the workflow waits for up to ``env_timeout_s``. When it overruns, the episode fails at once
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
import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trivium import faults

__all__ = ["EnvStopped", "EnvTimeoutError", "call_with_timeout", "hung_calls", "task_deadline"]


class EnvTimeoutError(TimeoutError):
    """An environment call did not return within ``env_timeout_s``; its episode fails."""


class EnvStopped(BaseException):
    """Raised inside an environment call's thread after the call overran its time limit."""


# The running task's deadline (time.monotonic()) and what set it: environment calls end by it too.
_TASK_DEADLINE: contextvars.ContextVar[tuple[float, str] | None] = contextvars.ContextVar(
    "trivium_task_deadline", default=None
)


@contextlib.contextmanager
def task_deadline(deadline: float | None, set_by: str) -> Iterator[None]:
    """Environment calls made inside end by ``deadline`` (``time.monotonic()``; None: no deadline) as well
    as by their own ``timeout_s``, whichever comes first (``explorer.dynamic_timeout``: a hung environment
    costs the task's limit, not the configured worst case)."""
    token = _TASK_DEADLINE.set(None if deadline is None else (deadline, set_by))
    try:
        yield
    finally:
        _TASK_DEADLINE.reset(token)


def _limit(timeout_s: float | None) -> tuple[float | None, str]:
    """The seconds a call may take now and what sets them: its own limit or the task's deadline."""
    limit, why = (timeout_s or None), f"env_timeout_s={timeout_s} s"
    task = _TASK_DEADLINE.get()
    if task is not None:
        left = task[0] - time.monotonic()
        if limit is None or left < limit:
            limit, why = left, f"the task's time limit ({task[1]})"
    return limit, why


_HUNG: dict[threading.Thread, tuple[str, float]] = {}  # overrun calls: thread -> (what, monotonic start)
_HUNG_LOCK = threading.Lock()


def call_with_timeout(
    fn: Callable[..., Any], *args: Any, timeout_s: float | None, what: str, fault_site: str | None = None
) -> Any:
    """``fn(*args)`` in a helper thread; ``EnvTimeoutError`` after ``timeout_s`` (None or 0: no limit),
    the thread told to stop (see the module docstring). ``fault_site``: a ``trivium.faults`` site that may
    inject a fault into this call."""
    if fault_site is not None:
        fn = faults.wrap(fault_site, fn, what, limit_s=timeout_s)
    timeout_s, why = _limit(timeout_s)
    if timeout_s is None:
        return fn(*args)
    if timeout_s <= 0:
        raise EnvTimeoutError(f"{what} was not started: the task is past {why}")
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # the caller's fault scope reaches rewards computed in the call

    def target() -> None:
        try:
            box["value"] = context.run(fn, *args)
        except BaseException as exc:  # re-raised in the caller (EnvStopped: the caller has left)
            box["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=target, name=f"env-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        with _HUNG_LOCK:
            _HUNG[thread] = (what, start)
        stop_thread(thread)
        injected = " (an injected hang, faults.env_hang)" if getattr(fn, "injected", "") == "env_hang" else ""
        raise EnvTimeoutError(f"{what} did not return within {why}{injected}")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def stop_thread(thread: threading.Thread) -> bool:
    """Raise ``EnvStopped`` in ``thread`` at its next bytecode; False when it is no longer running."""
    if thread.ident is None or not thread.is_alive():
        return False
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(EnvStopped)
    )
    return done == 1


def hung_calls() -> list[tuple[str, float]]:
    """``(what, seconds since it started)`` of every overrun environment call still running, oldest first."""
    now = time.monotonic()
    with _HUNG_LOCK:
        for thread in [t for t in _HUNG if not t.is_alive()]:
            del _HUNG[thread]
        return sorted(((what, now - start) for what, start in _HUNG.values()), key=lambda x: -x[1])
