"""The workflow contract: ``run(task, model) -> list[Experience]``.

A workflow turns one task into experiences: it may call the model several times, call tools or step an
environment, and it scores what came back. It never trains. It builds experiences from the engine's own
token ids, never by re-tokenising text.

``fields`` declares what a task row must hold (name -> allowed types); the task reader checks every row
against it when the task set is loaded, so a bad row fails early with its file, row and field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from trivium.models.handle import ModelHandle
from trivium.models.protocol import Generation
from trivium.types import Experience, Task, version_runs


class Workflow(ABC):
    name: ClassVar[str] = ""
    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {}
    #: Put every column of a task row in ``Task.data`` (not only ``fields``): for workflows whose
    #: environment or agent decides what it reads.
    reads_all_columns: ClassVar[bool] = False
    #: Each experience says which environment state its turn started from (``info["state"]``, equal for
    #: equal states): what the ``gigpo`` advantage groups turns by.
    records_states: ClassVar[bool] = False

    def __init__(self, **args: Any):
        if args:
            raise TypeError(f"workflow '{self.name}' takes no arguments, got {sorted(args)}")

    @abstractmethod
    def run(self, task: Task, model: ModelHandle) -> list[Experience]: ...


def experience_from_generation(
    gen: Generation,
    *,
    reward: float,
    task: Task,
    run_index: int,
    metrics: Mapping[str, float],
    messages: list[dict[str, Any]] | None = None,
    images: tuple[str, ...] = (),
) -> Experience:
    """A single-turn experience: the prompt, then the sampled response, every response token an action.
    ``messages``: the chat the prompt was rendered from, kept in ``info`` (Studio turns two answers to it
    into a preference pair); ``images``: the prompt's image references (``ImageStore``), in order."""
    # Built through numpy, which holds the GIL: torch's constructors release and retake it at each call, and
    # when a step's 32 workflow threads get their samples back together, that hand-off of the GIL cost ~5x
    # the work itself (a thread per task: explorer.max_concurrency 0)
    n = len(gen.response_ids)
    return Experience(
        tokens=torch.from_numpy(np.array([*gen.prompt_ids, *gen.response_ids], dtype=np.int64)),
        prompt_length=len(gen.prompt_ids),
        action_mask=torch.from_numpy(np.ones(n, dtype=np.bool_)),
        logprobs=torch.from_numpy(np.array(gen.logprobs, dtype=np.float32)),
        reward=float(reward),
        task_id=task.task_id,
        run_index=run_index,
        info={
            "response": gen.text,
            "finish_reason": gen.finish_reason,
            **({"messages": messages} if messages else {}),
            **({"token_versions": version_runs(gen.versions)} if gen.versions else {}),
        },
        metrics={**metrics, "response_length": float(len(gen.response_ids))},
        images=images,
    )
