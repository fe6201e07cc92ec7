"""Countdown: ask for an expression reaching ``target`` from ``numbers``; score with the task's reward
(``countdown``, rewards/countdown.py). Rows come from ``trivium.tasks.countdown`` or any file with the two
columns (``fields`` maps other column names)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from trivium.types import Task
from trivium.workflows.math import MathWorkflow
from trivium.workflows.registry import register_workflow


@register_workflow("countdown")
class CountdownWorkflow(MathWorkflow):
    """Rows: ``numbers`` (a list of integers) and ``target`` (an integer).

    Args (``workflow_args``): ``prompt_template`` formats the user message from ``{numbers}`` (space
    separated) and ``{target}``; the default is ``tasks.countdown.countdown_prompt``'s question, so SFT
    demonstrations made by that module share the prompt. ``system_prompt`` adds a system message.
    """

    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {"numbers": (list,), "target": (int,)}

    def __init__(
        self, prompt_template: str = "Make {target} from {numbers}.", system_prompt: str | None = None
    ):
        if "{target}" not in prompt_template or "{numbers}" not in prompt_template:
            raise ValueError(
                f"workflow_args.prompt_template must contain '{{numbers}}' and '{{target}}', got {prompt_template!r}"
            )
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt

    def messages(self, task: Task) -> list[dict[str, Any]]:
        numbers = " ".join(str(n) for n in task.data["numbers"])
        text = self.prompt_template.format(numbers=numbers, target=task.data["target"])
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": text}]
