"""Code: ask the question, sample answers, score each with the task's reward (``code``: the answer runs
against the row's ``tests`` in a sandbox, rewards/code.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from trivium.workflows.math import MathWorkflow
from trivium.workflows.registry import register_workflow


@register_workflow("code")
class CodeWorkflow(MathWorkflow):
    """Rows: ``question`` (the problem) and ``tests`` (a list of test cases, or its JSON text).

    Args (``workflow_args``): ``prompt_template`` (``{question}`` is replaced), ``system_prompt``.
    """

    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {"question": (str,), "tests": (list, str)}
