"""The reward seam: ``fn(response, data, **reward_args) -> RewardResult``, by name or ``module:function``.

A reward sees the response text, the task's mapped fields (``Task.data``) and the task set's
``reward_args`` (keyword arguments after the two inputs, checked against the signature by
``trivium check-config``) and nothing else, so it is a pure function that can run in any worker thread.
Callers never branch on the name. A function may also return a plain number; ``as_result`` turns it into a
``RewardResult``. A function may carry ``check_args(args) -> None`` (an attribute, set with
``register_reward(name, check_args=...)``) that raises ``ValueError`` on bad values (a regex that does not
compile): ``check_reward_args`` runs it at config validation, before any step.

Workflows call rewards through ``rewards/guard.py`` (``reward_for(task)``): a time limit, and a reward that
raises or overruns scores 0 with the reason counted instead of failing the task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trivium import faults
from trivium.registry import Registry, callable_part

__all__ = [
    "REWARD_FNS",
    "RewardFn",
    "RewardResult",
    "as_result",
    "check_reward_args",
    "get_reward_fn",
    "register_reward",
    "reward_task_fields",
]


@dataclass(frozen=True)
class RewardResult:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. accuracy, format; averaged per step


RewardFn = Callable[..., Any]  # (response: str, data: Mapping, **reward_args) -> RewardResult | float
REWARD_FNS: Registry[RewardFn] = Registry(
    "reward function",
    doc="fn(response: str, data: Mapping, **reward_args) -> RewardResult | float",
    check=callable_part,
    inputs=2,
)


def register_reward(
    name: str,
    *,
    check_args: Callable[[Mapping[str, Any]], None] | None = None,
    task_fields: tuple[str, ...] = (),
) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward; ``check_args(args)`` raises ``ValueError`` on bad ``reward_args``.
    ``task_fields``: optional task fields the reward reads beyond its workflow's (``rubric``'s per-task
    rubric): a task set may map them, and a column of that name reaches ``Task.data`` unmapped."""

    def add(fn: RewardFn) -> RewardFn:
        if check_args is not None:
            fn.check_args = check_args  # type: ignore[attr-defined]
        fn.task_fields = tuple(task_fields)  # type: ignore[attr-defined]
        return REWARD_FNS.register(name)(fn)

    return add


def reward_task_fields(name: str) -> tuple[str, ...]:
    """The optional task fields reward ``name`` reads (``register_reward(task_fields=...)``); () for an
    unknown name (reported elsewhere) or a ``module:function`` without the attribute."""
    if REWARD_FNS.problem(name):
        return ()
    return tuple(getattr(REWARD_FNS.get(name), "task_fields", ()))


def check_reward_args(name: str, args: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` (unknown keys) or ``ValueError`` (bad values, the reward's own ``check_args``)
    for a reward's ``reward_args``."""
    REWARD_FNS.check_args(name, args)


def get_reward_fn(
    name: str, args: Mapping[str, Any] | None = None
) -> Callable[[str, Mapping[str, Any]], RewardResult]:
    """The reward called ``name`` with ``args`` bound, returning a ``RewardResult`` whatever the function
    itself returns. It raises what the function raises; ``guard.reward_for`` is the guarded call."""
    fn = REWARD_FNS.get(name)
    kwargs = dict(args or {})

    def reward(response: str, data: Mapping[str, Any]) -> RewardResult:
        faults.at("reward", name)  # the fault-injection switch (trivium.faults); nothing when off
        return as_result(fn(response, data, **kwargs), name)

    reward.__wrapped__ = fn  # type: ignore[attr-defined]
    return reward


def as_result(value: Any, name: str) -> RewardResult:
    """A reward function's return value as a ``RewardResult``; a non-finite or non-numeric reward raises."""
    result = value if isinstance(value, RewardResult) else None
    if result is None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"reward function {name!r} returned {type(value).__name__} {value!r}: return a number or a "
                "RewardResult(reward, metrics)"
            )
        result = RewardResult(float(value))
    if not math.isfinite(result.reward):
        raise ValueError(f"reward function {name!r} returned a non-finite reward {result.reward!r}")
    return result
