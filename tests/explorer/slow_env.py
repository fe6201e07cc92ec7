"""A workflow whose one environment call takes the task's ``env_s`` seconds, then samples: the long tail
of agentic RL (a sandbox, a web page), for the explorer's tail-control tests."""

import time

from trivium.envs.calls import call_with_timeout
from trivium.types import Task
from trivium.workflows.base import Workflow, experience_from_generation
from trivium.workflows.registry import WORKFLOWS, register_workflow


def sleep_in_slices(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # slices: the stop signal of an overrun call lands between them
        time.sleep(0.01)


class EnvThenModel(Workflow):
    """One environment call that takes ``task.data["env_s"]`` seconds (a remote sandbox), then one sample."""

    def run(self, task, model):
        call_with_timeout(sleep_in_slices, task.data["env_s"], timeout_s=None, what="environment step")
        return [
            experience_from_generation(g, reward=float(i), task=task, run_index=i, metrics={})
            for i, g in enumerate(model.generate([1, 2, 3]))
        ]


if "test_env_then_model" not in WORKFLOWS:
    register_workflow("test_env_then_model")(EnvThenModel)


def tasks(*env_s):
    return [
        Task(f"t:{i}", {"env_s": s}, "test_env_then_model", "exact_match", 2) for i, s in enumerate(env_s)
    ]


class Feed:
    """A task reader handing out the given batches in turn (and checking how many were asked for)."""

    def __init__(self, *batches):
        self.batches = list(batches)

    def next_batch(self, k):
        batch = self.batches.pop(0)
        assert len(batch) == k, (len(batch), k)
        return batch


class Queue:
    def put(self, experiences):
        self.got = experiences
