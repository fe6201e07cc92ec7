"""The one explore loop (launch/explore_steps.py): each explore step waits for the weights version it needs,
then samples; used by the overlapped explorer thread and the decoupled explore process alike."""

from __future__ import annotations

import queue
import threading

import torch

from trivium.launch.explore_steps import Pacing, explore_steps
from trivium.sync.memory import MemorySync


class _Engine:
    """The part of a rollout engine a memory sync touches: its weights version."""

    def __init__(self):
        self.version = 0
        self.weights_dtype = torch.float32

    def update_weights(self, weights, version):
        self.version = version


class _Explorer:
    def __init__(self):
        self.model = _Engine()
        self.sampled_with: list[tuple[int, int]] = []  # (step, weights version it sampled with)

    def explore_step(self, step):
        self.sampled_with.append((step, self.model.version))
        return {"rollout/experiences": 1.0}


def test_each_step_waits_for_the_version_it_needs_and_records_the_wait():
    explorer = _Explorer()
    sync = MemorySync(explorer.model, verify=False)
    done: queue.Queue = queue.Queue()
    evals = []

    def run():
        steps = explore_steps(explorer, sync, range(1, 5), Pacing(2, 0, 0), lambda: evals.append(1))
        for step, record in steps:
            done.put((step, record))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    first = [done.get(timeout=30) for _ in range(2)]  # steps 1 and 2 sample with version 0
    assert [s for s, _ in first] == [1, 2]
    thread.join(timeout=0.5)
    assert thread.is_alive() and done.empty()  # step 3 needs version 2: it waits
    sync.publish({"w": torch.zeros(1)}, 2)
    rest = [done.get(timeout=30) for _ in range(2)]
    thread.join(timeout=30)
    assert explorer.sampled_with == [(1, 0), (2, 0), (3, 2), (4, 2)]
    assert all(r["sync/wait_seconds"] >= 0 for _, r in first + rest)
    assert rest[0][1]["sync/wait_seconds"] >= 0.4  # step 3 waited for the publish
    assert len(evals) == 4  # before_step ran once per step, after the wait


def test_without_a_sync_no_step_waits():
    explorer = _Explorer()
    got = list(explore_steps(explorer, None, range(3, 6), Pacing(1, 0, 7)))
    assert [s for s, _ in got] == [3, 4, 5] and explorer.sampled_with == [(3, 0), (4, 0), (5, 0)]
