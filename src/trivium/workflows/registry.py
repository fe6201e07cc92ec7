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
    builtins=[
        f"trivium.workflows.{m}"
        for m in ("agent", "code", "countdown", "dialogue", "math", "multi_turn", "reflect_retry", "vision")
    ],
)


def register_workflow(name: str):
    """Class decorator: register a ``Workflow`` subclass under ``name`` (also its ``name`` attribute)."""

    def deco(cls):
        cls.name = name
        return WORKFLOWS.register(name)(cls)

    return deco


def get_workflow(name: str):
    return WORKFLOWS.get(name)


def prompt_lengths(
    tasks, workflow: str, workflow_args, tokenizer, cap: int | None = None, image_tokens: int | None = None
) -> list[int | None]:
    """Tokens of each task's first prompt as its workflow renders it when the workflow says how
    (``messages``); otherwise the first field as one user message. What ``trivium doctor`` sizes with and
    check-config holds against the model's context (``on_long_row``). With ``cap``: a prompt with more text
    than ``cap`` tokens can hold (``chat.char_budget``) is not tokenised and its length is None (over cap).
    With ``image_tokens``: each image part counts as that many tokens (a vision-language model's largest
    image) instead of its one placeholder."""
    from trivium.models.chat import char_budget, message_chars, render_ids

    try:
        render = get_workflow(workflow)(**dict(workflow_args)).messages
    except Exception:  # a workflow without single-turn messages: its first field as the user's message
        render = None
    lengths = []
    for task in tasks:
        if render is not None:
            messages = render(task)
        else:
            messages = [{"role": "user", "content": str(next(iter(task.data.values()), ""))}]
        if cap is not None and message_chars(messages) > char_budget(tokenizer, cap):
            lengths.append(None)
        else:
            images = sum(
                1
                for m in messages
                if isinstance(m.get("content"), list)
                for p in m["content"]
                if isinstance(p, dict) and p.get("type") == "image"
            )
            lengths.append(len(render_ids(tokenizer, messages, True)) + images * ((image_tokens or 1) - 1))
    return lengths
