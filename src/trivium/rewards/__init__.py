"""Reward functions, looked up by name; importing this package registers the built-in ones."""

from trivium.rewards import ask as _ask  # noqa: F401  (registers "ask")
from trivium.rewards import code as _code  # noqa: F401  (registers "code")
from trivium.rewards import countdown as _countdown  # noqa: F401  (registers "countdown")
from trivium.rewards import format as _format  # noqa: F401  (registers "format")
from trivium.rewards import judge as _judge  # noqa: F401  (registers "llm_judge" and "rubric")
from trivium.rewards import math as _math  # noqa: F401  (registers "math_verify" and "exact_match")
from trivium.rewards.math import extract_final_answer
from trivium.rewards.registry import (
    REWARD_FNS,
    RewardFn,
    RewardResult,
    check_reward_args,
    get_reward_fn,
    register_reward,
)

__all__ = [
    "REWARD_FNS",
    "RewardFn",
    "RewardResult",
    "check_reward_args",
    "extract_final_answer",
    "get_reward_fn",
    "register_reward",
]
