"""explorer.over_rollout (issue 30 item 1): a step starts more tasks than it needs and goes ahead once
enough finished; the stragglers are cancelled at their next model or environment call, dropped whole (never
a half-finished group), and counted, not failed."""

import threading
import time

import pytest
from tests.explorer.slow_env import Feed, Queue, sleep_in_slices, tasks

from trivium.envs.calls import call_with_timeout, task_deadline
from trivium.explorer.explorer import Explorer
from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams, TaskCancelled
from trivium.models.transformers_engine import TransformersEngine


@pytest.fixture
def engine(tiny_model_dir):
    return BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))


def make(engine, feed, records, **kw):
    params = SamplingParams(max_tokens=3)
    return Explorer(
        engine,
        rollout_params=params,
        eval_params=params,
        taskset=feed,
        queue=Queue(),
        failure_sink=records.append,
        **kw,
    )


def test_a_step_goes_ahead_without_its_slowest_tasks(engine):
    records = []
    feed = Feed(tasks(0.02, 0.02, 30.0, 0.02, 0.02, 30.0))  # ceil(1.5 x 4) = 6 started, two hang
    explorer = make(engine, feed, records, batch_size=4, over_rollout_ratio=1.5)
    t0 = time.monotonic()
    metrics = explorer.explore_step(1)
    assert time.monotonic() - t0 < 10  # not the 30 s of the two stragglers
    assert metrics["rollout/cancelled_tasks"] == 2 and metrics["rollout/failed_tasks"] == 0
    assert metrics["rollout/experiences"] == 8 and metrics["rollout/unused_groups"] == 0
    got = explorer.queue.got
    assert sorted({e.task_id for e in got}) == ["t:0", "t:1", "t:3", "t:4"]  # whole groups only
    assert all(sum(e.group_id == g for e in got) == 2 for g in {e.group_id for e in got})
    assert records == []  # a cancelled task is not a failure


def test_with_a_wait_the_first_finished_in_task_order_are_trained(engine):
    records = []
    feed = Feed(tasks(0.3, 0.02, 0.02))  # ceil(1.5 x 2) = 3; all finish within the wait
    explorer = make(engine, feed, records, batch_size=2, over_rollout_ratio=1.5, over_rollout_wait_s=5.0)
    metrics = explorer.explore_step(1)
    assert metrics["rollout/cancelled_tasks"] == 0 and metrics["rollout/unused_groups"] == 1
    assert sorted({e.task_id for e in explorer.queue.got}) == ["t:0", "t:1"]  # not the two fastest


def test_the_ratio_is_checked():
    with pytest.raises(ValueError, match=r"over_rollout\.ratio must be >= 1"):
        Explorer(None, rollout_params=SamplingParams(), eval_params=SamplingParams(), over_rollout_ratio=0.5)


def test_a_queued_model_request_is_answered_with_task_cancelled(engine):
    engine.max_wait_s = 30.0  # a caller outside any worker waits this long for others to join its batch
    got = []

    def caller():
        try:
            engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2), order_key=7)
        except TaskCancelled as exc:
            got.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    time.sleep(0.2)
    assert engine.cancel([3]) == 0 and engine.cancel([7]) == 1
    thread.join(timeout=5)
    assert not thread.is_alive() and len(got) == 1


def test_an_environment_call_of_a_cancelled_task_stops_at_once():
    cancelled = threading.Event()
    threading.Timer(0.2, cancelled.set).start()
    t0 = time.monotonic()
    with task_deadline(None, "", cancelled), pytest.raises(TaskCancelled, match="went ahead without"):
        call_with_timeout(sleep_in_slices, 30.0, timeout_s=None, what="environment step")
    assert time.monotonic() - t0 < 3
    with task_deadline(None, "", cancelled), pytest.raises(TaskCancelled, match="not started"):
        call_with_timeout(sleep_in_slices, 0.0, timeout_s=None, what="environment step")
