"""The schedule of an explorer that runs ahead, and the staleness bound."""

import threading
import time

import pytest
import torch

from trivium.launch.overlap import VersionGate, required_version, staleness_filter
from trivium.types import Experience


@pytest.mark.parametrize(
    ("interval", "offset", "expected"),
    [
        (1, 0, [0, 1, 2, 3, 4, 5]),  # strictly on-policy: step s samples with version s - 1
        (2, 0, [0, 0, 2, 2, 4, 4]),  # weights move every 2 steps
        (1, 1, [0, 0, 1, 2, 3, 4]),  # one step ahead
        (2, 1, [0, 0, 0, 2, 2, 4]),
        (1, 100, [0, 0, 0, 0, 0, 0]),  # fully asynchronous: never waits for weights
    ],
)
def test_required_version(interval, offset, expected):
    assert [required_version(s, interval, offset) for s in range(1, 7)] == expected
    assert required_version(3, interval, offset, start=10) == 10 + expected[2]


def exp(version):
    return Experience(
        tokens=torch.tensor([1, 2]),
        prompt_length=1,
        action_mask=torch.ones(1, dtype=torch.bool),
        logprobs=torch.zeros(1),
        model_version=version,
    )


def test_staleness_drop_and_keep():
    batch = [exp(v) for v in (5, 4, 2, 1)]  # staleness 0, 1, 3, 4 at trainer version 5
    kept, m = staleness_filter(batch, trainer_version=5, max_staleness=2, policy="drop")
    assert [e.model_version for e in kept] == [5, 4]
    assert m == {
        "staleness/mean": 2.0,
        "staleness/max": 4.0,
        "staleness/over_limit": 2.0,
        "staleness/dropped": 2.0,
    }
    kept, m = staleness_filter(batch, trainer_version=5, max_staleness=2, policy="keep")
    assert len(kept) == 4 and m["staleness/over_limit"] == 2.0 and "staleness/dropped" not in m
    kept, m = staleness_filter(batch, trainer_version=5, max_staleness=None, policy="drop")
    assert len(kept) == 4 and "staleness/over_limit" not in m


def test_version_gate_blocks_until_published_or_stopped():
    gate = VersionGate(0)
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(gate.wait_for(2)))
    waiter.start()
    gate.publish(1)
    time.sleep(0.05)
    assert not seen  # version 1 is not enough
    gate.publish(2)
    waiter.join(timeout=5)
    assert seen == [True]
    stopper = threading.Thread(target=lambda: seen.append(gate.wait_for(9)))
    stopper.start()
    gate.stop()
    stopper.join(timeout=5)
    assert seen == [True, False]
