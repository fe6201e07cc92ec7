"""Faults injected at the explorer's real call sites take the path of real failures: the task or episode
fails (or is retried), the failure is recorded with what was injected, and each step counts them."""

import time

import pytest

from trivium.explorer.explorer import Explorer
from trivium.faults import FaultInjector, FaultRates
from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.types import Task


@pytest.fixture
def engine(tiny_model_dir):
    return BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))


class Tasks:
    """A task reader of ``n`` math tasks, the same every epoch (``next_batch`` walks them in order)."""

    def __init__(self, n, repeat=2, **kw):
        self.tasks = [
            Task(
                f"t:{i}",
                {"question": f"{i} plus 1?", "answer": str(i + 1)},
                "math",
                "exact_match",
                repeat,
                **kw,
            )
            for i in range(n)
        ]
        self.pos = 0

    def next_batch(self, k):
        out = [self.tasks[(self.pos + j) % len(self.tasks)] for j in range(k)]
        self.pos += k
        return out

    def state_dict(self):
        return {"pos": self.pos}


class Queue:
    def __init__(self):
        self.got = []

    def put(self, experiences):
        self.got += experiences


def make(engine, rates, records, **kw):
    params = SamplingParams(max_tokens=3)
    return Explorer(
        engine,
        rollout_params=params,
        eval_params=params,
        queue=Queue(),
        failure_sink=records.append,
        faults=FaultInjector(rates),
        **kw,
    )


def test_raising_and_hanging_workflows_fail_their_tasks_and_are_counted(engine):
    records = []
    rates = FaultRates(seed=1, workflow_raise=0.3, workflow_hang=0.1)
    explorer = make(engine, rates, records, taskset=Tasks(10), batch_size=10, workflow_timeout_s=0.3)
    metrics = explorer.explore_step(1)
    raised, hung = metrics["faults/workflow_raise"], metrics["faults/workflow_hang"]
    # the draws of this step, recomputed from their keys: the explorer's scope key is step|place|task|attempt
    again = FaultInjector(rates)
    kinds = [again.draw(f"explore:1|{i}|t:{i}|0", "workflow", 0) for i in range(10)]
    assert (raised, hung) == (kinds.count("raise"), kinds.count("hang")) and raised + hung > 0
    assert metrics["rollout/failed_tasks"] == raised + hung
    assert metrics["rollout/experiences"] == 2 * (10 - raised - hung)  # the good ones, all of them
    assert len(explorer.queue.got) == metrics["rollout/experiences"]
    assert sorted(r["task_id"] for r in records) == sorted(f"t:{i}" for i, k in enumerate(kinds) if k)
    for r in records:
        kind = kinds[int(r["task_id"][2:])]
        assert r["injected"] == [f"workflow_{kind}"] and r["when"] == "explore:1"
        assert ("InjectedFault" if kind == "raise" else "WorkflowTimeoutError") in r["reason"]


def test_a_retry_draws_again(engine):
    records = []
    rates = FaultRates(seed=0, workflow_raise=0.5)
    explorer = make(engine, rates, records, taskset=Tasks(6), batch_size=6, max_retries=3)
    metrics = explorer.explore_step(1)
    assert metrics["faults/workflow_raise"] > 0 and metrics["rollout/retries"] > 0
    assert all("workflow_raise" in r["reason"] and r["injected"] == ["workflow_raise"] for r in records)
    failed = metrics["rollout/failed_tasks"]
    assert metrics["rollout/experiences"] == 2 * (6 - failed)
    assert len(records) == metrics["faults/workflow_raise"]  # one record per failed attempt


def test_a_reward_fault_scores_zero_and_is_counted_without_failing_the_task(engine):
    """A raising reward (rewards/guard.py) scores 0 and counts in count/reward_error; the task goes on."""
    records = []
    explorer = make(engine, FaultRates(seed=0, reward_raise=0.5), records, taskset=Tasks(6), batch_size=6)
    metrics = explorer.explore_step(1)
    injected = metrics["faults/reward_raise"]
    assert 0 < injected < 12 and records == []  # 6 tasks x 2 samples, each drawn on its own
    assert metrics["rollout/failed_tasks"] == 0 and metrics["rollout/experiences"] == 12
    assert metrics["rollout/count/reward_error"] == injected
    zeroed = [e for e in explorer.queue.got if e.metrics["count/reward_error"] == 1.0]
    assert len(zeroed) == injected and all(e.reward == 0.0 for e in zeroed)


def test_evaluation_is_left_alone_unless_asked(engine):
    class Eval:
        name = "test"

        def all_tasks(self):
            return Tasks(4, repeat=1, is_eval=True).tasks

    records = []
    explorer = make(engine, FaultRates(workflow_raise=0.5), records, eval_tasksets=[Eval()])
    assert explorer.evaluate()["eval/test/failed_tasks"] == 0 and records == []
    explorer = make(
        engine, FaultRates(workflow_raise=0.5, in_eval=True, seed=2), records, eval_tasksets=[Eval()]
    )
    metrics = explorer.evaluate()
    assert metrics["eval/test/failed_tasks"] == metrics["eval/test/faults/workflow_raise"] > 0
    assert all(r["when"] == "eval" for r in records)


def test_environment_faults_fail_their_episodes_and_the_hung_ones_are_stopped(engine):
    """Multi-turn tasks over a scripted environment: injected reset/step failures and hangs (0.3 s limit)
    drop their episodes only; every dropped episode is recorded with what was injected into its task."""
    from tests.workflows.conftest import CountdownEnv

    from trivium.envs.calls import hung_calls

    args = {"env": "tests.workflows.conftest:CountdownEnv", "env_args": {"turns": 2}, "env_timeout_s": 0.3}
    tasks = Tasks(6, repeat=3)
    tasks.tasks = [
        Task(t.task_id, {"n": i}, "multi_turn", "exact_match", 3, workflow_args=args)
        for i, t in enumerate(tasks.tasks)
    ]
    CountdownEnv.created = 0
    records = []
    started = time.monotonic()
    # hang_s 60: a hang ends only when the timeout's stop reaches it (by itself it would outlast the test)
    explorer = make(
        engine,
        FaultRates(seed=4, env_raise=0.1, env_hang=0.1, hang_s=60),
        records,
        taskset=tasks,
        batch_size=6,
    )
    metrics = explorer.explore_step(1)
    injected = metrics["faults/env_raise"] + metrics["faults/env_hang"]
    assert metrics["faults/env_raise"] > 0 and metrics["faults/env_hang"] > 0
    dropped = metrics["rollout/failed_runs"] + 3 * metrics["rollout/failed_tasks"]
    assert dropped == injected  # one injected fault ends one episode
    assert metrics["rollout/experiences"] == 6 * 3 - injected
    assert all(
        r["injected"] and ("env_raise" in r["reason"] or "injected hang" in r["reason"]) for r in records
    )

    # the injected hangs are stopped (within a 50 ms sleep slice once their thread runs: on a loaded machine
    # that can take seconds, so the wait is long; a hang that is not stopped would last 60 s). Only this
    # test's calls count: another test's uninterruptible 30 s sleep (CountdownEnv hang_on) may still run.
    def mine():
        return [w for w, age in hung_calls() if "CountdownEnv" in w and age <= time.monotonic() - started]

    deadline = time.monotonic() + 20
    while mine() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not mine()
