"""The version arithmetic (an explorer that runs ahead, the staleness bound) and the in-memory sync's wait."""

import threading
import time

import pytest
import torch

from trivium.models.weights import WeightSyncError, weights_checksum
from trivium.sync.memory import MemorySync
from trivium.sync.protocol import SyncStopped
from trivium.sync.versions import is_sync_step, required_version, staleness_filter
from trivium.types import Experience, version_runs


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
        "staleness/token_mean": 2.0,  # one action token each
        "staleness/token_max": 4.0,
        "staleness/over_limit": 2.0,
        "staleness/dropped": 2.0,
    }
    kept, m = staleness_filter(batch, trainer_version=5, max_staleness=2, policy="keep")
    assert len(kept) == 4 and m["staleness/over_limit"] == 2.0 and "staleness/dropped" not in m
    kept, m = staleness_filter(batch, trainer_version=5, max_staleness=None, policy="drop")
    assert len(kept) == 4 and "staleness/over_limit" not in m


def test_a_partial_rollout_s_tokens_are_as_stale_as_the_weights_that_sampled_each():
    """A sample that spanned an in-flight update (versions 3 then 5; an environment token between, -1) is
    one experience of staleness 2 by its model_version, and tokens of staleness 2, 2 and 0."""
    spanning = Experience(
        tokens=torch.tensor([1, 2, 3, 4, 5]),
        prompt_length=1,
        action_mask=torch.tensor([True, True, False, True]),
        logprobs=torch.zeros(4),
        model_version=3,
        info={"token_versions": version_runs([3, 3, -1, 5])},
    )
    assert spanning.info["token_versions"] == [[3, 2], [-1, 1], [5, 1]]
    assert spanning.action_versions() == [3, 3, 5]
    _, m = staleness_filter([spanning], trainer_version=5, max_staleness=None, policy="drop")
    assert m["staleness/mean"] == 2.0 and m["staleness/max"] == 2.0
    assert m["staleness/token_mean"] == 4 / 3 and m["staleness/token_max"] == 2.0


class Engine:
    """The smallest rollout model a sync can talk to: weights and a version."""

    def __init__(self):
        self.version, self.weights = 0, {"w": torch.zeros(2)}

    def update_weights(self, state, version):
        self.weights = {k: v.clone() for k, v in state.items()}
        self.version = version

    def state_dict(self):
        return self.weights

    weights_dtype = torch.float32

    def weights_checksum(self):
        return weights_checksum(self.weights)


def test_memory_sync_pull_blocks_until_published_or_closed():
    engine = Engine()
    sync = MemorySync(engine)
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(sync.pull(engine, at_least=2)))
    waiter.start()
    sync.publish({"w": torch.ones(2)}, 1)
    time.sleep(0.05)
    assert not seen and engine.version == 1  # version 1 is not enough
    metrics = sync.publish({"w": torch.full((2,), 2.0)}, 2)
    waiter.join(timeout=5)
    assert seen == [None] and "sync/seconds" in metrics and "sync/checksum_seconds" in metrics
    with pytest.raises(WeightSyncError, match="waited 0 s for weights version 3"):
        sync.pull(engine, at_least=3, timeout_s=0.01)
    errors = []

    def wait_forever():
        try:
            sync.pull(engine, at_least=9)
        except SyncStopped as stop:
            errors.append(stop)

    stopper = threading.Thread(target=wait_forever)
    stopper.start()
    sync.close()
    stopper.join(timeout=5)
    assert len(errors) == 1


def test_memory_sync_refuses_an_engine_that_loads_something_else():
    class Lossy(Engine):
        def update_weights(self, state, version):
            super().update_weights({k: v * 0.5 for k, v in state.items()}, version)

    sync = MemorySync(Lossy())
    with pytest.raises(
        WeightSyncError, match=r"version 1 from the trainer \(in memory\): the rollout model.s checksum"
    ):
        sync.publish({"w": torch.ones(2)}, 1)


def test_sync_steps_are_every_interval_and_the_last():
    assert [s for s in range(1, 8) if is_sync_step(s, 3, 7)] == [3, 6, 7]
