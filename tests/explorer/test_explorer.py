"""Explorer: one step of real rollouts through the batching engine, stamping, failures, evaluation."""

import pytest

from trivium.buffer.queue import ExperienceQueue
from trivium.buffer.task_reader import TaskSetReader
from trivium.explorer.explorer import Explorer
from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.workflows.math import MathWorkflow


def reader(path, **kw):
    return TaskSetReader(
        str(path),
        name=path.stem,
        fields={"question": "question", "answer": "answer"},
        required=MathWorkflow.fields,
        workflow="math",
        reward_fn="math_verify",
        **kw,
    )


@pytest.fixture
def engine(tiny_model_dir):
    return BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))


def make_explorer(engine, word_problem_dir, **kw):
    return Explorer(
        engine,
        rollout_params=SamplingParams(temperature=1.0, max_tokens=16),
        eval_params=SamplingParams(temperature=0.0, max_tokens=16),
        taskset=reader(word_problem_dir / "train.jsonl", repeat_times=4, seed=0),
        eval_tasksets=[reader(word_problem_dir / "test.jsonl", repeat_times=1, is_eval=True, shuffle=False)],
        queue=ExperienceQueue(64),
        batch_size=4,
        **kw,
    )


def test_explore_step_stamps_groups_versions_and_batches_calls(engine, word_problem_dir):
    explorer = make_explorer(engine, word_problem_dir)
    engine.update_weights(engine.state_dict(), version=7)
    metrics = explorer.explore_step(step=3)
    exps = explorer.queue.get(16)
    assert engine.engine_calls == 1  # four concurrent workflows, one batched engine call
    assert sorted({e.group_id for e in exps}) == [0, 1, 2, 3]
    assert all(e.model_version == 7 and e.explore_step == 3 for e in exps)
    for g in range(4):
        group = [e for e in exps if e.group_id == g]
        assert len(group) == 4 and len({e.task_id for e in group}) == 1
        assert sorted(e.run_index for e in group) == [0, 1, 2, 3]
    assert metrics["rollout/count"] == 16
    assert 0.0 <= metrics["rollout/accuracy"] <= 1.0
    assert metrics["rollout/response_tokens"] == sum(e.response_length for e in exps)
    explorer.explore_step(step=4)
    assert sorted({e.group_id for e in explorer.queue.get(16)}) == [4, 5, 6, 7]  # ids never repeat


def test_a_sync_between_the_steps_start_and_its_samples_stamps_the_weights_that_sampled(
    engine, word_problem_dir, monkeypatch
):
    """An explorer that runs ahead reads the version when its step starts; a sync can land before the first
    token. The samples are stamped with the weights that drew them, not as stale as the step's start."""
    import trivium.explorer.explorer as module

    explorer = make_explorer(engine, word_problem_dir)
    engine.update_weights(engine.state_dict(), version=7)

    tally_class = module.StepTally

    def tally_then_sync(version):
        tally = tally_class(version=version)
        engine.update_weights(engine.state_dict(), version=8)  # the trainer publishes: the step read 7
        return tally

    monkeypatch.setattr(module, "StepTally", tally_then_sync)
    metrics = explorer.explore_step(step=1)
    assert metrics["rollout/model_version"] == 7.0  # the step began with 7
    assert {e.model_version for e in explorer.queue.get(16)} == {8}


def test_seeded_exploration_is_reproducible(tiny_model_dir, word_problem_dir):
    runs = []
    for _ in range(2):
        engine = BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))
        explorer = make_explorer(engine, word_problem_dir, max_concurrency=2)
        explorer.explore_step(step=1)
        runs.append([e.tokens.tolist() for e in explorer.queue.get(16)])
    assert runs[0] == runs[1]


def test_a_failing_workflow_fails_only_its_task(engine, word_problem_dir, monkeypatch):
    explorer = make_explorer(engine, word_problem_dir)
    batch = reader(word_problem_dir / "train.jsonl", repeat_times=4, seed=0).next_batch(4)  # same order
    failing = {batch[0].task_id, batch[2].task_id}
    original = MathWorkflow.run

    def flaky(self, task, model):
        if task.task_id in failing:
            raise RuntimeError("environment exploded")
        return original(self, task, model)

    monkeypatch.setattr(MathWorkflow, "run", flaky)
    metrics = explorer.explore_step(step=1)
    assert metrics["rollout/failed_tasks"] == 2
    assert {e.task_id for e in explorer.queue.get(8)} == {batch[1].task_id, batch[3].task_id}
    assert len(explorer.queue) == 0

    monkeypatch.setattr(MathWorkflow, "run", lambda self, task, model: 1 / 0)
    with pytest.raises(RuntimeError, match="every task of the batch failed"):
        explorer.explore_step(step=2)


def test_evaluate_reports_accuracy_per_taskset(engine, word_problem_dir):
    explorer = make_explorer(engine, word_problem_dir)
    metrics = explorer.evaluate()
    assert metrics["eval/test/count"] == 16
    assert 0.0 <= metrics["eval/test/accuracy"] <= 1.0
    assert metrics["eval/test/reward_mean"] == metrics["eval/test/accuracy"]  # math reward is 0/1 accuracy
    assert len(explorer.queue) == 0  # eval experiences never reach the trainer


def test_evaluate_with_k_samples_reports_mean_best_worst(engine, word_problem_dir):
    explorer = make_explorer(engine, word_problem_dir)
    explorer.eval_params = SamplingParams(n=4, temperature=1.0, max_tokens=16)
    m = explorer.evaluate()
    assert m["eval/test/count"] == 64
    assert 0.0 <= m["eval/test/worst@4"] <= m["eval/test/mean@4"] <= m["eval/test/best@4"] <= 1.0
    assert m["eval/test/mean@4"] == pytest.approx(m["eval/test/accuracy"])


def test_at_k_from_hand_made_results():
    import torch

    from trivium.explorer.explorer import TaskResult, at_k
    from trivium.types import Experience, Task

    def exp(acc):
        return Experience(
            tokens=torch.tensor([1, 2]),
            prompt_length=1,
            action_mask=torch.ones(1, dtype=torch.bool),
            logprobs=torch.zeros(1),
            reward=acc,
            metrics={"accuracy": acc},
        )

    task = Task(task_id="t", data={}, workflow="math", reward_fn="math_verify")
    results = [
        TaskResult(task, [exp(1), exp(0), exp(0)]),
        TaskResult(task, [exp(1), exp(1), exp(1)]),
        TaskResult(task, [exp(0), exp(0), exp(0)]),
        TaskResult(task, [], RuntimeError("failed")),
    ]
    assert at_k(results, 3, "eval/x") == {
        "eval/x/mean@3": pytest.approx((1 / 3 + 1 + 0) / 3),
        "eval/x/best@3": pytest.approx(2 / 3),
        "eval/x/worst@3": pytest.approx(1 / 3),
    }
    assert at_k(results, 1, "eval/x") == {}
