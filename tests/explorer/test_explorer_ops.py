"""The explorer with experience operators and an adaptive task feed: real rollouts of the tiny model."""

import pytest

from trivium.buffer.operators import ExperiencePipeline
from trivium.buffer.queue import ExperienceQueue
from trivium.buffer.selectors import SELECTORS
from trivium.buffer.task_feed import TaskFeed, TaskSource
from trivium.buffer.task_reader import TaskSetReader
from trivium.explorer.explorer import Explorer
from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.workflows.math import MathWorkflow


@pytest.fixture
def engine(tiny_model_dir):
    return BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))


def feed(word_problem_dir, selector="online_difficulty"):
    reader = TaskSetReader(
        str(word_problem_dir / "train.jsonl"), name="train", fields={}, required=MathWorkflow.fields,
        workflow="math", reward_fn="math_verify", repeat_times=4,
    )  # fmt: skip
    tasks = reader.all_tasks()
    return TaskFeed([TaskSource("train", tasks, 1.0, SELECTORS.get(selector)(tasks, seed=0))])


def explorer(engine, taskset, **kw):
    return Explorer(
        engine,
        rollout_params=SamplingParams(temperature=1.0, max_tokens=8),
        eval_params=SamplingParams(temperature=0.0, max_tokens=8),
        taskset=taskset,
        queue=ExperienceQueue(256),
        batch_size=3,
        **kw,
    )


def test_operators_shape_what_reaches_the_queue_and_selectors_see_every_rollout(engine, word_problem_dir):
    tasks = feed(word_problem_dir)
    ops = ExperiencePipeline([("reward_scale", {"shift": 10.0}), ("truncated", {})], max_tokens=8)
    ex = explorer(engine, tasks, experience_ops=ops)
    metrics = ex.explore_step(step=1)
    n = int(metrics["rollout/experiences"])
    queued = ex.queue.get(n) if n else []
    assert all(e.reward >= 10.0 for e in queued)  # shifted by the first operator
    assert metrics["ops/reward_scale/changed"] == 12  # 3 tasks x 4 samples
    assert metrics["ops/truncated/kept"] == n and metrics["ops/truncated/dropped"] == 12 - n
    assert all(e.info["finish_reason"] != "length" for e in queued)
    assert metrics["rollout/groups"] == 3 and 0 <= metrics["rollout/informative_groups"] <= 3
    posterior = tasks.sources[0].selector
    observed = [i for i in range(len(posterior.alpha)) if posterior.alpha[i] + posterior.beta[i] > 2.0]
    assert len(observed) == 3 and all(
        posterior.alpha[i] + posterior.beta[i] == 6.0 for i in observed
    )  # 4 rollouts


def test_dynamic_sampling_refills_until_the_operators_pass_enough_groups(engine, word_problem_dir):
    drop_all = ExperiencePipeline([("reward_range", {"min": 5.0})])
    ex = explorer(
        engine,
        feed(word_problem_dir, "shuffle"),
        experience_ops=drop_all,
        dynamic_sampling=True,
        max_sampling_rounds=1,
    )
    with pytest.raises(
        RuntimeError, match=r"kept 0 of 3 groups after 1 extra round\(s\).*\['reward_range'\]"
    ):
        ex.explore_step(step=1)


class DropFirst:
    """An experience operator that drops the first ``n`` groups it is given and passes the rest."""

    def __init__(self, n):
        self.left = n

    def names(self):
        return ["drop_first"]

    def __call__(self, groups):
        dropped = min(self.left, len(groups))
        self.left -= dropped
        return groups[dropped:], {"ops/drop_first/dropped": float(dropped)}


def test_dynamic_sampling_samples_more_tasks_until_batch_size_groups_pass(engine, word_problem_dir):
    def dropping_explorer(max_rounds):
        ops = DropFirst(4)
        return explorer(
            engine, feed(word_problem_dir, "shuffle"), experience_ops=ops, dynamic_sampling=True,
            max_sampling_rounds=max_rounds,
        )  # fmt: skip

    # batch 3: round 0 samples 3 tasks (all dropped), extra round 1 samples 3 (1 dropped, 2 kept), extra
    # round 2 samples the 1 task still missing
    ex = dropping_explorer(2)
    metrics = ex.explore_step(step=1)
    assert metrics["rollout/tasks"] == 7 and metrics["rollout/groups"] == 7
    assert metrics["rollout/extra_rounds"] == 2 and metrics["ops/drop_first/dropped"] == 4
    assert metrics["rollout/experiences"] == 12  # batch_size 3 groups x 4 samples, no more
    queued = ex.queue.get(12)
    assert len({e.group_id for e in queued}) == 3 and all(len(e.tokens) for e in queued)
    # one extra round fewer allowed: the step fails and says how many extra rounds ran
    short = dropping_explorer(1)
    with pytest.raises(RuntimeError, match=r"kept 2 of 3 groups after 1 extra round\(s\)"):
        short.explore_step(step=1)


def test_the_old_dynamic_sampling_flag_alone_is_the_zero_variance_operator(engine, word_problem_dir):
    # the untrained tiny model answers nothing right: every group is all zeros, so every group is dropped
    ex = explorer(engine, feed(word_problem_dir, "shuffle"), dynamic_sampling=True, max_sampling_rounds=1)
    with pytest.raises(RuntimeError, match=r"kept 0 of 3 groups.*\['zero_variance'\]"):
        ex.explore_step(step=1)
