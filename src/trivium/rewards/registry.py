"""The reward seam: ``fn(response, data) -> RewardResult``, looked up by name or ``module:function``.

A reward sees the response text and the task's mapped fields (``Task.data``) and nothing else, so it is a
pure function that can run in any worker thread. Callers never branch on the name. A function may also
return a plain number; ``as_result`` turns it into a ``RewardResult``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trivium import faults
from trivium.registry import Registry, callable_part

__all__ = ["REWARD_FNS", "RewardFn", "RewardResult", "as_result", "get_reward_fn", "register_reward"]


@dataclass(frozen=True)
class RewardResult:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. accuracy, format; averaged per step


RewardFn = Callable[[str, Mapping[str, Any]], RewardResult]
REWARD_FNS: Registry[RewardFn] = Registry(
    "reward function", doc="fn(response: str, data: Mapping) -> RewardResult | float", check=callable_part
)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    return REWARD_FNS.register(name)


def get_reward_fn(name: str) -> Callable[[str, Mapping[str, Any]], RewardResult]:
    """The reward called ``name``, returning a ``RewardResult`` whatever the function itself returns."""
    fn = REWARD_FNS.get(name)

    def reward(response: str, data: Mapping[str, Any]) -> RewardResult:
        faults.at("reward", name)  # the fault-injection switch (trivium.faults); nothing when off
        return as_result(fn(response, data), name)

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
