"""Calls in helper threads that the caller may stop waiting for, and stopping a Python thread from outside:
how the run bounds an environment step (``envs/calls.py``) and a reward (``rewards/guard.py``) in time.

``call_in_helper(fn, ...)`` runs ``fn`` in a helper thread and returns a ``HelperCall`` to wait on. Helper
threads are kept and reused: a GRPO step of 32 tasks x 8 samples makes 256 reward calls, and starting a
thread for each (``Thread.start`` waits until the new thread runs, which under the GIL and 32 busy workflow
threads took ~0.3 ms a call) cost about as much as the rewards themselves (``benchmarks/helper_calls.py``).
The explorer runs its workflows in them too (``map_in_helpers``), a task a helper at a time.

``HelperCall.stop()`` ends a call that overran: ``stop_thread`` raises ``EnvStopped`` in its thread
(``PyThreadState_SetAsyncExc``); Python delivers it at the thread's next bytecode, so a loop in Python code
stops, and a thread blocked in one C call stops when that call returns. ``EnvStopped`` is a
``BaseException``: ``except Exception`` in the stopped code does not swallow it. A stopped call's thread is
never given another call (the exception may still be on its way to it): it ends when the call does, so a
thread that is alive is a call still running (``envs/calls.hung_calls``).
"""

from __future__ import annotations

import contextvars
import ctypes
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["EnvStopped", "HelperCall", "call_in_helper", "map_in_helpers", "stop_thread"]

# helper threads kept waiting for calls (an eval of 256 tasks runs 256 workflows at once, each scoring its
# sample in a helper of its own); one finishing a call beyond this many ends
IDLE_HELPERS_MAX = 512
_IDLE_NAME = "helper-idle"


class EnvStopped(BaseException):
    """Raised inside a call's thread (an environment step, a reward) after the call overran its time limit."""


def stop_thread(thread: threading.Thread) -> bool:
    """Raise ``EnvStopped`` in ``thread`` at its next bytecode; False when it is no longer running."""
    if thread.ident is None or not thread.is_alive():
        return False
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(EnvStopped)
    )
    return done == 1


class HelperCall:
    """One call running in a helper thread: ``wait`` for it, then ``result()``; ``stop()`` it if it overran."""

    def __init__(self, fn: Callable[..., Any], args: tuple, name: str):
        self._fn, self._args, self.name = fn, args, name
        self._context = contextvars.copy_context()  # the caller's fault scope reaches the call
        self._done = threading.Lock()
        self._done.acquire()  # released when the call has finished
        self._finished = False  # set under _LOCK, with the helper's choice to take more calls
        self._stopped = False
        self._value: Any = None
        self._error: BaseException | None = None
        self.thread: threading.Thread | None = None  # the helper running it

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the call has finished, waiting up to ``timeout_s`` seconds for it (None: until it has)."""
        if self._done.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            self._done.release()
            return True
        return False

    @property
    def finished(self) -> bool:
        return self._finished

    def result(self) -> Any:
        """The call's return value, or its exception raised here; the call must have finished."""
        if not self._finished:
            raise RuntimeError(f"{self.name}: result() before the call finished (wait() for it first)")
        if self._error is not None:
            raise self._error
        return self._value

    def stop(self) -> bool:
        """Stop the call if it is still running (``EnvStopped`` raised in its thread, which then takes no
        other call); False when it had finished, so its result stands."""
        with _LOCK:
            if self._finished:
                return False
            self._stopped = True
            thread = self.thread
        if thread is not None:
            stop_thread(thread)
        return True

    def _run(self) -> None:
        try:
            self._value = self._context.run(self._fn, *self._args)
        except BaseException as exc:  # raised in the caller by result() (EnvStopped: the caller has left)
            self._error = exc


class _Helper(threading.Thread):
    """A daemon thread that runs calls handed to it one at a time and waits for the next when idle."""

    def __init__(self) -> None:
        super().__init__(name=_IDLE_NAME, daemon=True)
        self.calls: queue.SimpleQueue[HelperCall] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            while self._serve(self.calls.get()):
                pass
        except EnvStopped:  # a stop that arrived after its call had returned: this thread ends anyway
            pass

    def _serve(self, call: HelperCall) -> bool:
        """Run ``call``; whether this thread takes another one."""
        self.name = call.name
        try:
            call._run()
        finally:
            with _LOCK:
                call._finished = True
                keep = not call._stopped and len(_IDLE) < IDLE_HELPERS_MAX
                if keep:
                    self.name = _IDLE_NAME
                    _IDLE.append(self)
            call._done.release()
        return keep


_LOCK = threading.Lock()
_IDLE: list[_Helper] = []


def call_in_helper(fn: Callable[..., Any], *args: Any, name: str) -> HelperCall:
    """Start ``fn(*args)`` in an idle helper thread (a new one when none is idle), in a copy of the caller's
    context; ``name`` names the thread while the call runs (``env-...``, ``reward-...``: the stall doctor
    reads it)."""
    call = HelperCall(fn, args, name)
    with _LOCK:
        helper = _IDLE.pop() if _IDLE else None
        if helper is not None:
            call.thread = helper
    if helper is None:
        helper = _Helper()
        call.thread = helper
        helper.calls.put(call)
        helper.start()
    else:
        helper.calls.put(call)
    return call


def map_in_helpers(
    fn: Callable[[Any], Any], items: Sequence[Any], *, workers: int, name: str
) -> tuple[list[Future], Callable[[], None]]:
    """``fn(item)`` for every item, at most ``workers`` at once, in helper threads named ``{name}_{i}``,
    each taking the next item in order when it is free (as a ``ThreadPoolExecutor`` of ``workers`` threads
    would, without starting them: a thread start waits until the new thread runs, which took up to a GIL
    switch interval each while the started ones were busy: ~1 s for an eval of 256 tasks here). Returns a
    future per item, in order, and ``join()``, which waits until the helpers are done."""
    futures: list[Future] = [Future() for _ in items]
    queue_ = iter(list(enumerate(items)))
    take = threading.Lock()

    def runner() -> None:
        while True:
            with take:
                nxt = next(queue_, None)
            if nxt is None:
                return
            index, item = nxt
            future = futures[index]
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(item))
            except BaseException as exc:  # the caller's result() raises it, as from an executor's future
                future.set_exception(exc)

    runners = [call_in_helper(runner, name=f"{name}_{i}") for i in range(min(workers, len(futures)))]

    def join() -> None:
        for r in runners:
            r.wait()

    return futures, join


def _forget_helpers() -> None:
    """In a forked child: the parent's helper threads do not exist there."""
    global _LOCK
    _LOCK = threading.Lock()
    _IDLE.clear()


os.register_at_fork(after_in_child=_forget_helpers)
