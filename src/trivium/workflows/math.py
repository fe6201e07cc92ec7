"""Single-turn math: ask the question, sample ``repeat_times`` answers, score each with the task's reward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from trivium.models.handle import ModelHandle
from trivium.types import Experience, Task
from trivium.workflows.base import Workflow, experience_from_generation
from trivium.workflows.registry import register_workflow


@register_workflow("math")
class MathWorkflow(Workflow):
    """GSM8K-style rows: ``question`` and ``answer`` (a solution ending in ``#### N``, or the bare value).

    Args (``workflow_args``): ``prompt_template`` formats the user message (``{question}`` is replaced);
    ``system_prompt`` adds a system message.
    """

    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {"question": (str,), "answer": (str, int, float)}

    def __init__(self, prompt_template: str = "{question}", system_prompt: str | None = None):
        if "{question}" not in prompt_template:
            raise ValueError(
                f"workflow_args.prompt_template must contain '{{question}}', got {prompt_template!r}"
            )
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt

    def messages(self, task: Task) -> list[dict[str, Any]]:
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        msgs.append({"role": "user", "content": self.prompt_template.format(question=task.data["question"])})
        return msgs

    def prompt(self, task: Task, model: ModelHandle) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """The chat to answer and the references of its images (none here; ``visual_qa`` has them)."""
        return self.messages(task), ()

    def run(self, task: Task, model: ModelHandle) -> list[Experience]:
        from trivium.rewards.guard import reward_for

        reward_fn = reward_for(task)
        messages, images = self.prompt(task, model)
        generations = model.chat(messages, images=images)
        out = []
        for i, gen in enumerate(generations):
            result = reward_fn(gen.text, task.data)
            out.append(
                experience_from_generation(
                    gen,
                    reward=result.reward,
                    task=task,
                    run_index=i,
                    metrics=result.metrics,
                    messages=messages,
                    images=images,
                )
            )
        return out
