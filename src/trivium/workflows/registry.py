"""The workflow seam: ``WORKFLOWS`` (a ``trivium.registry.Registry``) of ``Workflow`` subclasses.

A task set names its workflow by registered name (``math``, ``multi_turn``, ...) or as ``module:Class``.
"""

from __future__ import annotations

from typing import Any

from trivium.registry import Registry


def _is_workflow(obj: Any) -> str | None:
    from trivium.workflows.base import Workflow

    if isinstance(obj, type) and issubclass(obj, Workflow):
        return None
    return f"is {obj!r}, not a subclass of trivium.workflows.base.Workflow"


WORKFLOWS: Registry[type] = Registry(
    "workflow",
    doc="a Workflow subclass: Class(**workflow_args).run(task, model) -> [Experience]",
    check=_is_workflow,
)


def register_workflow(name: str):
    """Class decorator: register a ``Workflow`` subclass under ``name`` (also its ``name`` attribute)."""

    def deco(cls):
        cls.name = name
        return WORKFLOWS.register(name)(cls)

    return deco


def get_workflow(name: str):
    return WORKFLOWS.get(name)


# Built-in workflows register themselves on import; their modules import nothing heavy at module level.
from trivium.workflows import agent as _agent  # noqa: E402, F401
from trivium.workflows import code as _code  # noqa: E402, F401
from trivium.workflows import countdown as _countdown  # noqa: E402, F401
from trivium.workflows import math as _math  # noqa: E402, F401
from trivium.workflows import multi_turn as _multi_turn  # noqa: E402, F401
