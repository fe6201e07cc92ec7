"""Stopping a Python thread from outside: how the run ends a call it stopped waiting for (an environment
step that overran its limit, ``envs/calls.py``; a reward that overran its own, ``rewards/guard.py``).

``stop_thread`` raises ``EnvStopped`` in the thread (``PyThreadState_SetAsyncExc``); Python delivers it at
the thread's next bytecode, so a loop in Python code stops, and a thread blocked in one C call stops when
that call returns. ``EnvStopped`` is a ``BaseException``: ``except Exception`` in the stopped code does not
swallow it.
"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["EnvStopped", "stop_thread"]


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
