"""Environments for multi-turn workflows: the contract (``base``) and built-in environments."""

from trivium.envs.base import (
    ENVIRONMENTS,
    Environment,
    StepResult,
    as_messages,
    image_part,
    make_env,
    register_env,
)

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "StepResult",
    "as_messages",
    "image_part",
    "make_env",
    "register_env",
]
