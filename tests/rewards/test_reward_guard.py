"""Every reward call is guarded: raising or overrunning scores 0 with the reason counted, never fails."""

import threading
import time

import pytest

from trivium.explorer.explorer import summarize
from trivium.rewards import REWARD_FNS, RewardResult, register_reward
from trivium.rewards.guard import FAILURE_COUNTS, guarded_reward, reward_for
from trivium.types import Experience, Task


@pytest.fixture
def restore_registry():
    with REWARD_FNS.snapshot():
        yield


def ok_counts():
    return dict.fromkeys(FAILURE_COUNTS, 0.0)


def test_a_good_reward_gets_zero_failure_counts_and_its_args(restore_registry):
    @register_reward("scaled")
    def scaled(response, data, factor=1.0):
        return RewardResult(factor * len(response), {"length": float(len(response))})

    task = Task("t", {}, "math", "scaled", reward_args={"factor": 0.5}, reward_timeout_s=5.0)
    assert reward_for(task)("abcd", {}) == RewardResult(2.0, {"length": 4.0, **ok_counts()})
    assert guarded_reward("scaled")("ab", {}).reward == 2.0  # no args, no limit: in this thread


def test_a_raising_reward_scores_zero_and_is_counted(restore_registry, caplog):
    register_reward("broken")(lambda response, data: 1 / 0)
    reward = guarded_reward("broken", timeout_s=5.0)
    for _ in range(3):
        assert reward("x", {}) == RewardResult(0.0, {**ok_counts(), "count/reward_error": 1.0})
    assert sum("ZeroDivisionError" in r.getMessage() for r in caplog.records) <= 1  # logged once


def test_a_hanging_reward_is_stopped_and_scores_zero(restore_registry):
    stopped = threading.Event()

    @register_reward("busy")
    def busy(response, data):
        try:
            while True:  # a Python loop: the stop exception reaches it at its next bytecode
                time.sleep(0.01)
        finally:
            stopped.set()

    t0 = time.monotonic()
    result = guarded_reward("busy", timeout_s=0.2)("x", {})
    assert result == RewardResult(0.0, {**ok_counts(), "count/reward_timeout": 1.0})
    assert time.monotonic() - t0 < 2.0
    assert stopped.wait(5.0)  # the helper thread was told to stop, and did


def test_wrong_return_types_are_errors_not_crashes(restore_registry):
    register_reward("text")(lambda response, data: "good")
    assert guarded_reward("text")("x", {}).metrics["count/reward_error"] == 1.0


def test_counts_are_summed_over_a_step_and_other_metrics_averaged():
    import torch

    def exp(metrics):
        return Experience(
            torch.tensor([1, 2]), 1, torch.ones(1, dtype=torch.bool), torch.zeros(1), 0.0, metrics=metrics
        )

    rows = [
        {"count/reward_error": e, "format": f} for e, f in ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.0, 1.0))
    ]
    out = summarize([exp(m) for m in rows], "rollout")
    assert out["rollout/count/reward_error"] == sum(r["count/reward_error"] for r in rows)  # 2
    assert out["rollout/format"] == sum(r["format"] for r in rows) / len(rows)  # 0.75


def test_an_unknown_reward_still_fails_at_once():
    from trivium.registry import UnknownPartError

    with pytest.raises(UnknownPartError, match="unknown reward function 'nope'"):
        guarded_reward("nope")
