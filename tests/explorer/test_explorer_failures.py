"""Explorer robustness: retries, workflow timeouts, failed episodes recorded with task id and reason."""

import time

import pytest

from trivium.explorer.explorer import Explorer
from trivium.models.batching import BatchingRolloutModel
from trivium.models.handle import WorkflowTimeoutError
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.types import Task
from trivium.workflows.base import Workflow, experience_from_generation
from trivium.workflows.registry import WORKFLOWS, register_workflow

ATTEMPTS: dict[str, int] = {}


def _register(name):
    def deco(cls):
        return cls if name in WORKFLOWS else register_workflow(name)(cls)

    return deco


@_register("test_flaky_once")
class FlakyOnce(Workflow):
    """Fails the first attempt of every task, then samples normally."""

    def run(self, task, model):
        ATTEMPTS[task.task_id] = ATTEMPTS.get(task.task_id, 0) + 1
        if ATTEMPTS[task.task_id] == 1:
            raise ConnectionError("flaky backend")
        gens = model.generate([1, 2, 3])
        return [
            experience_from_generation(g, reward=0.0, task=task, run_index=i, metrics={})
            for i, g in enumerate(gens)
        ]


@_register("test_slow")
class Slow(Workflow):
    def run(self, task, model):
        time.sleep(0.3)
        model.generate([1, 2, 3])
        raise AssertionError("the model call should have raised")


@pytest.fixture
def engine(tiny_model_dir):
    return BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))


def explorer(engine, records, **kw):
    params = SamplingParams(max_tokens=4)
    return Explorer(engine, rollout_params=params, eval_params=params, failure_sink=records.append, **kw)


def tasks(workflow, n=3, **kw):
    return [
        Task(f"{workflow}:{i}", {"n": i}, workflow, "exact_match", repeat_times=2, **kw) for i in range(n)
    ]


def test_retries_rerun_a_failed_task_and_record_each_failure(engine):
    ATTEMPTS.clear()
    records = []
    results = explorer(engine, records, max_retries=1).run_tasks(
        tasks("test_flaky_once"), SamplingParams(), True
    )
    assert all(r.error is None and len(r.experiences) == 2 and r.retries == 1 for r in results)
    assert sorted(r["task_id"] for r in records) == [f"test_flaky_once:{i}" for i in range(3)]
    assert all(
        r["attempt"] == 0 and "flaky backend" in r["reason"] and r["run_index"] is None for r in records
    )


def test_without_retries_the_task_fails_and_the_batch_fails_loudly(engine):
    ATTEMPTS.clear()
    with pytest.raises(RuntimeError, match="every task of the batch failed"):
        explorer(engine, []).run_tasks(tasks("test_flaky_once"), SamplingParams(), True)


def test_a_workflow_over_time_stops_at_its_next_model_call_and_is_not_retried(engine):
    records = []
    ex = explorer(engine, records, max_retries=2, workflow_timeout_s=0.1)
    with pytest.raises(RuntimeError) as info:
        ex.run_tasks(tasks("test_slow", n=1), SamplingParams(), True)
    assert isinstance(info.value.__cause__, WorkflowTimeoutError)
    assert len(records) == 1 and "workflow_timeout_s" in records[0]["reason"]


def test_failed_episodes_of_a_multi_turn_task_are_recorded_with_their_run(engine):
    records = []
    args = {
        "env": "tests.workflows.conftest:CountdownEnv",
        "env_args": {"turns": 2, "fail_on": 1},
    }
    from tests.workflows.conftest import CountdownEnv

    CountdownEnv.created = 0
    (result,) = explorer(engine, records).run_tasks(
        tasks("multi_turn", n=1, workflow_args=args), SamplingParams(max_tokens=4), True
    )
    assert result.error is None and result.failed_runs == 1 and len(result.experiences) == 1
    assert records == [
        {
            "when": "explore",
            "task_id": "multi_turn:0",
            "workflow": "multi_turn",
            "run_index": 1,
            "attempt": 0,
            "reason": "step 0: RuntimeError('environment exploded')",
        }
    ]
