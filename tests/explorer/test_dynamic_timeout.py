"""explorer.dynamic_timeout (issue 30 item 2): a task's limit follows the run's own task durations, and a
hung environment call costs that limit, not the configured worst case."""

import time

import pytest
from tests.explorer.slow_env import Feed, Queue, tasks

from trivium.envs.calls import EnvTimeoutError
from trivium.explorer.explorer import Explorer
from trivium.explorer.timeouts import TaskTimeouts
from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine


def test_the_limit_is_a_multiple_of_the_mean_of_recent_successes_and_never_above_the_fixed_one():
    t = TaskTimeouts(0.0, ratio=3.0, window=4, min_samples=2)
    assert t.limit() == (0.0, "explorer.workflow_timeout_s=0 s")  # too few samples yet: the fixed limit
    t.succeeded(1.0)
    t.succeeded(3.0)
    seconds, why = t.limit()
    assert seconds == pytest.approx(6.0) and "dynamic_timeout" in why and "mean 2 s" in why
    assert t.limit(explore=False)[0] == 0.0  # evaluation keeps the fixed limit
    for s in (1.0, 1.0, 1.0, 1.0):  # the window keeps the last four
        t.succeeded(s)
    assert t.limit()[0] == pytest.approx(3.0)
    capped = TaskTimeouts(2.0, ratio=3.0, min_samples=1)
    capped.succeeded(1.0)
    assert capped.limit() == (2.0, "explorer.workflow_timeout_s=2 s")
    restored = TaskTimeouts(0.0, ratio=3.0, min_samples=2)
    restored.load_state_dict(t.state_dict())
    assert restored.limit() == t.limit()
    with pytest.raises(ValueError, match="ratio must be >= 1"):
        TaskTimeouts(ratio=0.5)


def test_a_hung_environment_costs_the_dynamic_limit_and_fails_only_its_task(tiny_model_dir):
    engine = BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))
    records = []
    params = SamplingParams(max_tokens=3)
    explorer = Explorer(
        engine,
        rollout_params=params,
        eval_params=params,
        failure_sink=records.append,
        workflow_timeout_s=60.0,  # the configured worst case
        timeouts=TaskTimeouts(60.0, ratio=3.0, min_samples=4),
    )
    first = explorer.run_tasks(tasks(0.05, 0.05, 0.05, 0.05), params, True)  # the run learns its pace
    assert all(r.error is None and r.seconds >= 0.05 for r in first)
    limit, why = explorer.timeouts.limit()
    assert 0.15 <= limit < 10 and "dynamic_timeout" in why

    t0 = time.monotonic()
    second = explorer.run_tasks(tasks(0.05, 30.0, 0.05, 0.05), params, True)
    took = time.monotonic() - t0
    assert took < limit + 5, took  # not the 30 s of the hung call, nor the fixed 60 s
    hung = second[1]
    assert isinstance(hung.error, EnvTimeoutError) and hung.timed_out and hung.retries == 0
    assert [r.error is None for r in second] == [True, False, True, True]
    assert len(records) == 1 and "explorer.dynamic_timeout" in records[0]["reason"]
    assert records[0]["task_id"] == "t:1"


def test_a_step_reports_its_task_durations_and_timeouts(tiny_model_dir):
    engine = BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))

    params = SamplingParams(max_tokens=3)
    explorer = Explorer(
        engine,
        rollout_params=params,
        eval_params=params,
        taskset=Feed(tasks(0.02, 0.02), tasks(0.02, 20.0)),
        queue=Queue(),
        batch_size=2,
        timeouts=TaskTimeouts(0.0, ratio=2.0, min_samples=2),
    )
    calm = explorer.explore_step(1)
    assert calm["rollout/timed_out_tasks"] == 0 and calm["rollout/task_seconds_max"] >= 0.02
    assert (
        calm["rollout/task_seconds_p50"]
        <= calm["rollout/task_seconds_p95"]
        <= calm["rollout/task_seconds_max"]
    )
    assert calm["rollout/task_timeout_s"] > 0  # two successes: the limit for the next step
    tail = explorer.explore_step(2)
    assert tail["rollout/timed_out_tasks"] == 1 and tail["rollout/failed_tasks"] == 1
    assert tail["rollout/task_seconds_max"] < 10 and tail["rollout/experiences"] == 2
