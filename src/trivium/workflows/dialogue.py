"""Single-turn over a logged conversation (``dialogue``): the row's ``messages`` are the prompt, the model
writes the next assistant turn ``repeat_times`` times, each scored by the task's reward with the row.

For offline data that is a conversation so far, e.g. the Learn-to-Ask samples of ``tasks/ask.py`` (each
assistant turn of a logged dialogue, with what the situation was there): the reward reads the row's other
fields (the reward's ``task_fields``). ``messages`` is a list of ``{"role": "system" | "user" | "assistant",
"content": str}`` ending with a user message; a bad row fails with its task id and the message index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from trivium.types import Task
from trivium.workflows.math import MathWorkflow
from trivium.workflows.registry import register_workflow

__all__ = ["DialogueWorkflow"]

_ROLES = ("system", "user", "assistant")


@register_workflow("dialogue")
class DialogueWorkflow(MathWorkflow):
    """The row's ``messages`` as the chat to continue (module docstring). Arg: ``system_prompt``."""

    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {"messages": (list,)}

    def __init__(self, system_prompt: str | None = None):
        super().__init__(system_prompt=system_prompt)

    def messages(self, task: Task) -> list[dict[str, Any]]:
        rows = task.data["messages"]
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for k, m in enumerate(rows):
            if (
                not isinstance(m, Mapping)
                or m.get("role") not in _ROLES
                or not isinstance(m.get("content"), str)
            ):
                raise ValueError(
                    f"task {task.task_id!r}: messages[{k}] must be {{role: system|user|assistant, content: str}}, "
                    f"got {str(m)[:120]!r}"
                )
            out.append({"role": m["role"], "content": m["content"]})
        if not rows or out[-1]["role"] != "user":
            raise ValueError(
                f"task {task.task_id!r}: messages must end with a user message (the turn the model answers), "
                f"got {len(rows)} message(s)"
            )
        return out
