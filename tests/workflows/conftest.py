"""Environments for the workflow tests: scripted, so every episode's turns are known in advance."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest

from trivium.envs.base import Diagnosis, Environment, StepResult


class CountdownEnv(Environment):
    """Answers every model turn with 'left: k'; done after ``turns`` turns, reward 1 on the last one.

    With ``step_rewards`` it pays 0.25 on every turn instead. ``fail_run``/``hang_run`` make the episode whose
    task data ``run`` counter matches raise or hang (counted per instance created).
    """

    created = 0

    def __init__(self, turns: int = 3, step_rewards: bool = False, fail_on: int = -1, hang_on: int = -1):
        self.turns, self.step_rewards = turns, step_rewards
        self.index = CountdownEnv.created
        CountdownEnv.created += 1
        self.fail_on, self.hang_on = fail_on, hang_on
        self.taken = 0
        self.closed = False

    def reset(self, task):
        return [
            {"role": "system", "content": "Play."},
            {"role": "user", "content": f"Start {task.data['n']}"},
        ]

    def step(self, action):
        if self.index == self.fail_on:
            raise RuntimeError("environment exploded")
        if self.index == self.hang_on:
            time.sleep(30)
        self.taken += 1
        done = self.taken >= self.turns
        reward = 0.25 if self.step_rewards else float(done)
        return StepResult(
            observation=f"left: {self.turns - self.taken}", reward=reward, done=done, info={"x": 2}
        )

    def close(self):
        self.closed = True


class EvenEnv(Environment):
    """Two turns: the first is free, the second wins (reward 1) when its text has an even length.

    ``diagnose`` blames turn 1 and flags odd-length texts as repeats of the mistake (``unavoidable``: every
    text). ``drift``: each instance shows a different opening, so a replay in a fresh instance differs.
    """

    created = 0
    instances: ClassVar[list] = []  # every one made, to check that each was closed

    def __init__(self, drift: bool = False, unavoidable: bool = False):
        self.drift, self.unavoidable = drift, unavoidable
        self.index = EvenEnv.created
        EvenEnv.created += 1
        EvenEnv.instances.append(self)
        self.taken = 0
        self.closed = False

    def reset(self, task):
        return f"Start {task.data['n']}" + (f" #{self.index}" if self.drift else "")

    def step(self, action):
        self.taken += 1
        if self.taken == 1:
            return StepResult(observation="Again.")
        win = float(len(action) % 2 == 0)
        return StepResult(reward=win, done=True, info={"success": win})

    def close(self):
        self.closed = True

    def diagnose(self, actions):
        repeats = (lambda text: True) if self.unavoidable else (lambda text: len(text) % 2 == 1)
        return Diagnosis(1, "the second turn's text had an odd length", repeats=repeats)


@pytest.fixture(autouse=True)
def _reset_counter():
    CountdownEnv.created = EvenEnv.created = 0
    EvenEnv.instances = []
    yield
