"""A simulated user with a word problem that may miss a number (``"ask_user"``; ``tasks/ask.py``).

Task row: the fields ``tasks.ask.write_ask`` writes (``name``, ``item``, ``start``, ``verb``, ``amount``,
``missing``). The opening is the problem; a question about the missing number gets it, a question about a
number the problem states (or one already told) gets "You know that already.", anything else a reminder to
ask or answer. An answer (a ``#### N`` line) ends the episode: reward 1.0 when N is right, else 0.0.

``info``: ``success``; ``needed`` (1 when the problem misses a number); ``asked_right`` (1 when the missing
number was asked for and told); ``asked_first`` (1 when the first turn was the right question);
``needless`` (questions about numbers already known); ``questions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from trivium.envs.base import Environment, StepResult, register_env
from trivium.tasks.ask import Problem, parse_turn, reply
from trivium.types import Task

__all__ = ["AskUserEnv"]


@register_env("ask_user")
class AskUserEnv(Environment):
    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {
        "name": (str,),
        "item": (str,),
        "start": (int,),
        "verb": (int,),
        "amount": (int,),
    }

    def __init__(self) -> None:
        self.problem: Problem | None = None
        self.revealed: set[str] = set()
        self.questions = self.needless = 0
        self.first_right = False

    def reset(self, task: Task) -> str:
        try:
            self.problem = Problem.from_row(task.data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"task {task.task_id!r}: not an ask_user row ({exc!r}); see tasks/ask.py"
            ) from exc
        return self.problem.question()

    def step(self, action: str) -> StepResult:
        p = self.problem
        kind, value = parse_turn(action, p)
        if kind == "answer":
            win = float(value == p.value())
            return StepResult(reward=win, done=True, info=self._info(win))
        before = set(self.revealed)
        text = reply(p, action, self.revealed)
        if kind == "ask":
            self.questions += 1
            told = self.revealed != before
            self.needless += not told
            self.first_right = self.first_right or (told and self.questions == 1)
        return StepResult(observation=text, info=self._info(0.0))

    def _info(self, success: float) -> dict[str, Any]:
        return {
            "success": success,
            "needed": float(self.problem.missing is not None),
            "asked_right": float(bool(self.revealed)),
            "asked_first": float(self.first_right),
            "needless": float(self.needless),
            "questions": float(self.questions),
        }
