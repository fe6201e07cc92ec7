"""Single-turn visual questions: an image (or several) and a question, ``repeat_times`` answers, each scored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from trivium.models.handle import ModelHandle
from trivium.types import Task
from trivium.workflows.math import MathWorkflow
from trivium.workflows.registry import register_workflow


@register_workflow("visual_qa")
class VisualQAWorkflow(MathWorkflow):
    """Rows with ``image`` (a path, relative to the working directory, a ``data:image/...;base64`` URL, or a
    list of them), ``question`` and ``answer``; the images come first in the user message, then the
    question (``prompt_template``). Needs a vision-language model (``trivium make-tiny --vlm``).

    The images are read, checked and stored once per task (``ImageStore`` under the run folder); every
    sample of the group refers to the same stored file. A row whose image cannot be read fails as a task
    error that names the row and field (the run goes on; ``explorer/failed_tasks`` counts it).
    """

    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {
        "image": (str, list),
        "question": (str,),
        "answer": (str, int, float),
    }

    def messages(self, task: Task, images: int = 1) -> list[dict[str, Any]]:
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        text = self.prompt_template.format(question=task.data["question"])
        parts = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": text}]
        msgs.append({"role": "user", "content": parts})
        return msgs

    def prompt(self, task: Task, model: ModelHandle) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        value = task.data["image"]
        refs = model.put_images(
            value if isinstance(value, list) else [value], f"task {task.task_id}, field 'image'"
        )
        return self.messages(task, len(refs)), refs
