"""The workflow registry: a plain dict filled by a decorator. Cheap to import (no torch, no models)."""

from __future__ import annotations

from typing import Any

WORKFLOWS: dict[str, Any] = {}


def register_workflow(name: str):
    def deco(cls):
        if name in WORKFLOWS:
            raise ValueError(f"workflow '{name}' is already registered (by {WORKFLOWS[name].__module__})")
        WORKFLOWS[name] = cls
        cls.name = name
        return cls

    return deco


def get_workflow(name: str):
    try:
        return WORKFLOWS[name]
    except KeyError:
        raise KeyError(f"unknown workflow '{name}'; registered: {', '.join(sorted(WORKFLOWS))}") from None


# Built-in workflows register themselves on import; their modules import nothing heavy at module level.
from trivium.workflows import agent as _agent  # noqa: E402, F401
from trivium.workflows import math as _math  # noqa: E402, F401
from trivium.workflows import multi_turn as _multi_turn  # noqa: E402, F401
