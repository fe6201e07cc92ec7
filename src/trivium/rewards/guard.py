"""Rewards that never fail a step: a time limit, and a failure scored 0 with its reason counted.

``reward_for(task)`` is how workflows and environments call a task's reward. The call runs in a helper
thread (``threads.call_in_helper``: kept and reused between calls) that the caller waits for up to
``reward_timeout_s`` (0: no limit, the call runs in the caller's thread). Then:

- it returned: its ``RewardResult``, with ``count/reward_timeout = 0`` and ``count/reward_error = 0`` added;
- it raised (any ``Exception``, an injected ``reward_raise`` fault included): reward 0, ``count/reward_error
  = 1``; the first failure of each (reward, exception type) is logged as a warning with its message;
- it overran: reward 0, ``count/reward_timeout = 1``, and the helper thread is told to stop (an exception
  raised in it at its next bytecode, as for environment calls: ``envs/calls.py``). A thread blocked in one
  C call cannot be stopped that way; it is left running as a daemon and ends when that call returns.
  Rewards that run foreign code (``code``) run it in a subprocess with its own limits and kill it.

The explorer sums metrics named ``count/...`` over a step (``rollout/count/reward_error`` is the number of
failed reward calls of the step), where other metrics are averaged.

Why 0 and not a failed task: one bad answer (a parser that chokes, a sandbox that hangs) must not throw
away the other answers of its group. Experiences scored this way carry the counts in their metrics, so an
experience filter can drop them. Configuration mistakes are caught before the run instead:
``check-config`` checks ``reward_args`` against the function's signature and its ``check_args``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from trivium.rewards.registry import RewardResult, get_reward_fn
from trivium.threads import call_in_helper
from trivium.types import Task

__all__ = ["FAILURE_COUNTS", "guarded_reward", "reward_for"]

log = logging.getLogger(__name__)
FAILURE_COUNTS = ("count/reward_timeout", "count/reward_error")
_OK = dict.fromkeys(FAILURE_COUNTS, 0.0)
_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


def reward_for(task: Task) -> Callable[[str, Mapping[str, Any]], RewardResult]:
    """The guarded reward of ``task``: its ``reward_fn`` with ``reward_args``, under ``reward_timeout_s``."""
    return guarded_reward(task.reward_fn, task.reward_args, task.reward_timeout_s)


def guarded_reward(
    name: str, args: Mapping[str, Any] | None = None, timeout_s: float = 0.0
) -> Callable[[str, Mapping[str, Any]], RewardResult]:
    """``get_reward_fn(name, args)`` that returns reward 0 with the reason counted instead of raising or
    hanging (module docstring). An unknown ``name`` raises here, at once."""
    plain = get_reward_fn(name, args)

    def reward(response: str, data: Mapping[str, Any]) -> RewardResult:
        try:
            result = _call(plain, response, data, timeout_s, name)
        except _Overran:
            return _failed("count/reward_timeout")
        except Exception as exc:
            _log_once(name, exc)
            return _failed("count/reward_error")
        return RewardResult(result.reward, {**result.metrics, **_OK})

    reward.__wrapped__ = plain  # type: ignore[attr-defined]
    return reward


class _Overran(Exception):
    pass


def _call(fn: Callable[..., RewardResult], response: str, data: Any, timeout_s: float, name: str):
    if not timeout_s:
        return fn(response, data)
    call = call_in_helper(fn, response, data, name=f"reward-{name}")
    if not call.wait(timeout_s) and call.stop():
        log.warning("reward %r did not return within reward_timeout_s=%s s: scored 0", name, timeout_s)
        raise _Overran
    call.wait()  # it finished as the time ran out: its result stands
    return call.result()


def _failed(reason: str) -> RewardResult:
    return RewardResult(0.0, {**_OK, reason: 1.0})


def _log_once(name: str, exc: BaseException) -> None:
    key = (name, type(exc).__name__)
    with _logged_lock:
        first = key not in _logged
        _logged.add(key)
    if first:
        log.warning("reward %r raised %r: scored 0 (counted in count/reward_error; logged once)", name, exc)
