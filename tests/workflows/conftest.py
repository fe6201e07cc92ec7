"""Environments for the workflow tests: scripted, so every episode's turns are known in advance."""

from __future__ import annotations

import time

import pytest

from trivium.envs.base import Environment, StepResult


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


@pytest.fixture(autouse=True)
def _reset_counter():
    CountdownEnv.created = 0
    yield
