"""The reward seam: ``fn(response, data) -> RewardResult``, looked up by name.

A reward sees the response text and the task's mapped fields (``Task.data``) and nothing else, so it is a
pure function that can run in any worker thread. Callers never branch on the name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REWARD_FNS", "RewardFn", "RewardResult", "get_reward_fn", "register_reward"]


@dataclass(frozen=True)
class RewardResult:
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. accuracy, format; averaged per step


RewardFn = Callable[[str, Mapping[str, Any]], RewardResult]
REWARD_FNS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def decorator(fn: RewardFn) -> RewardFn:
        if name in REWARD_FNS:
            raise ValueError(
                f"reward {name!r} is already registered (by {REWARD_FNS[name].__module__}); pick another name"
            )
        REWARD_FNS[name] = fn
        return fn

    return decorator


def get_reward_fn(name: str) -> RewardFn:
    if name not in REWARD_FNS:
        raise KeyError(f"unknown reward_fn {name!r}; registered rewards: {sorted(REWARD_FNS)}")
    return REWARD_FNS[name]
