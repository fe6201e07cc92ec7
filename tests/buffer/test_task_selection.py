"""Task selectors and the mixing task feed: orders, pacing, the online posterior, exact resume, ratios."""

import io
import random

import pytest
import torch

from trivium.buffer.selectors import SELECTORS, Curriculum, OnlineDifficulty, TaskSelector
from trivium.buffer.task_feed import TaskFeed, TaskSource
from trivium.buffer.task_reader import TaskSetReader
from trivium.types import Task


def tasks(n: int, name: str = "t", **raw) -> list[Task]:
    return [
        Task(
            task_id=f"{name}:{i}",
            data={},
            workflow="math",
            reward_fn="exact_match",
            index=i,
            raw={"i": i, **raw},
        )
        for i in range(n)
    ]


def roundtrip(state):
    """Through a checkpoint file exactly as trainer_state.pt is written and read (weights_only)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_sequential_and_shuffle_match_the_task_readers_orders():
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(7)]
    for shuffle, name in ((True, "shuffle"), (False, "sequential")):
        reader = TaskSetReader(
            rows, name="r", fields={}, required={"question": (str,), "answer": (str,)}, workflow="math",
            reward_fn="exact_match", repeat_times=1, shuffle=shuffle, seed=3,
        )  # fmt: skip
        selector = SELECTORS.get(name)(reader.all_tasks(), seed=3)
        expected = [t.index for n in (3, 5, 9) for t in reader.next_batch(n)]
        assert [i for n in (3, 5, 9) for i in selector.select(n)] == expected


def test_a_task_reader_state_of_an_earlier_checkpoint_resumes_at_the_same_task():
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(7)]
    reader = TaskSetReader(
        rows, name="r", fields={}, required={"question": (str,), "answer": (str,)}, workflow="math",
        reward_fn="exact_match", repeat_times=1, seed=3,
    )  # fmt: skip
    reader.next_batch(5)
    old_state = roundtrip(reader.state_dict())  # what an earlier version's checkpoint holds
    feed = TaskFeed(
        [TaskSource("r", reader.all_tasks(), 1.0, SELECTORS.get("shuffle")(reader.all_tasks(), seed=3))]
    )
    feed.load_state_dict(old_state)
    assert [t.index for t in feed.next_batch(6)] == [t.index for t in reader.next_batch(6)]
    online = TaskFeed(
        [TaskSource("r", reader.all_tasks(), 1.0, OnlineDifficulty(reader.all_tasks(), seed=3))]
    )
    with pytest.raises(ValueError, match="kind: saved 'Shuffle', now 'OnlineDifficulty'"):
        online.load_state_dict(old_state)


def test_random_draws_with_replacement_and_is_seeded():
    a, b = SELECTORS.get("random")(tasks(5), seed=1), SELECTORS.get("random")(tasks(5), seed=1)
    draws = [a.select(4) for _ in range(50)]
    assert draws == [b.select(4) for _ in range(50)]
    flat = [i for d in draws for i in d]
    assert set(flat) == set(range(5)) and any(len(set(d)) < 4 for d in draws)  # repeats within a batch


def test_curriculum_pool_grows_easy_to_hard():
    difficulty = [5, 1, 4, 2, 3, 0, 9, 8, 7, 6]  # easiest first: task 5 (0), 1 (1), 3 (2), 4 (3), ...
    ts = [
        Task(task_id=f"c:{i}", data={}, workflow="m", reward_fn="r", raw={"difficulty": d})
        for i, d in enumerate(difficulty)
    ]
    cur = Curriculum(ts, seed=0, start_fraction=0.2, pace_tasks=40)
    assert cur.order[:4] == [5, 1, 3, 4]
    first = cur.select(4)  # competence 0.2: the two easiest only
    assert set(first) == {5, 1}
    for _ in range(4):
        cur.select(4)
    # after 20 of 40 paced tasks: c = 0.2 + 0.8 * 0.5 = 0.6, the 6 easiest
    assert cur.competence() == pytest.approx(0.6)
    assert set(cur.select(6)) == set(cur.order[:6])
    assert Curriculum(
        ts, seed=0, start_fraction=0.2, pace_tasks=40, schedule="root"
    ).competence() == pytest.approx(0.2)
    hard_first = Curriculum(ts, seed=0, higher_is_harder=False)
    assert hard_first.order[:2] == [6, 7]


def test_curriculum_names_the_row_without_a_difficulty():
    ts = tasks(3)
    with pytest.raises(ValueError, match=r"t:0 has difficulty=None.*difficulty_field"):
        Curriculum(ts)


def test_online_difficulty_posterior_update_is_the_beta_bernoulli_one():
    sel = OnlineDifficulty(tasks(3), prior_alpha=1.0, prior_beta=1.0)
    sel.observe(0, [1.0, 1.0, 0.0, 1.0])  # 3 successes of 4: Beta(1 + 3, 1 + 1)
    assert (sel.alpha[0], sel.beta[0]) == (4.0, 2.0)
    assert sel.expected_pass_rate(0) == pytest.approx(4 / 6)
    decayed = OnlineDifficulty(tasks(1), decay=0.5)
    decayed.observe(0, [1.0, 1.0])  # Beta(3, 1)
    decayed.observe(0, [0.0, 0.0])  # alpha: 1 + 0.5 (3 - 1) + 0 = 2; beta: 1 + 0.5 (1 - 1) + 2 = 3
    assert (decayed.alpha[0], decayed.beta[0]) == (2.0, 3.0)


def test_online_difficulty_prefers_tasks_near_the_target_pass_rate():
    sel = OnlineDifficulty(tasks(30), seed=0)
    for i in range(30):  # tasks 0-9 always solved, 10-19 half, 20-29 never; 40 observations each
        p = 1.0 if i < 10 else 0.5 if i < 20 else 0.0
        sel.observe(i, [p] * 40)
    picked = [i for _ in range(20) for i in sel.select(5)]
    middle = sum(10 <= i < 20 for i in picked) / len(picked)
    assert middle > 0.95  # Beta(21, 21) draws land near 0.5; Beta(41, 1) and Beta(1, 41) near the ends
    sel_easy = OnlineDifficulty(tasks(30), seed=0, target=0.9)
    for i in range(30):
        sel_easy.observe(i, [1.0 if i < 10 else 0.5 if i < 20 else 0.0] * 40)
    assert sum(i < 10 for _ in range(20) for i in sel_easy.select(5)) > 90  # of 100


def test_a_pooled_prior_has_the_mean_pass_rate_of_all_observations():
    sel = OnlineDifficulty(tasks(3), prior_alpha=1.0, prior_beta=3.0, pooled_prior=True)
    sel.observe(0, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # 1 success of 6
    # pooled mean (1 + 1) / (6 + 4) = 0.2, strength 4: prior Beta(0.8, 3.2), i.e. shifts (-0.2, +0.2)
    assert sel._prior_shift() == pytest.approx((-0.2, 0.2))
    assert OnlineDifficulty(tasks(3))._prior_shift() == (0.0, 0.0)
    weak = OnlineDifficulty(tasks(40), seed=0, pooled_prior=True)
    for i in range(30):  # a weak model: 30 tasks seen, never solved but 5 of them sometimes
        weak.observe(i, [1.0, 0.0, 0.0, 0.0] if i < 5 else [0.0] * 4)
    picked = [i for _ in range(20) for i in weak.select(4)]
    assert sum(i < 5 for i in picked) > sum(i >= 30 for i in picked)  # the sometimes-solved before the unseen


def test_online_difficulty_explores_unseen_tasks():
    sel = OnlineDifficulty(tasks(20), seed=0)
    for i in range(10):
        sel.observe(i, [0.0] * 20)  # known hopeless
    picked = {i for _ in range(10) for i in sel.select(4)}
    assert picked and picked <= set(range(10, 20))


@pytest.mark.parametrize(
    "name,args",
    [
        ("online_difficulty", {}),
        ("online_difficulty", {"pooled_prior": True, "decay": 0.9}),
        ("curriculum", {}),
        ("random", {}),
        ("shuffle", {}),
    ],
)
def test_saved_and_loaded_state_continues_with_the_same_selections(name, args):
    ts = tasks(40, difficulty=1.0)
    rng = random.Random(0)
    first = SELECTORS.get(name)(ts, seed=7, **args)
    for _ in range(6):
        for i in first.select(8):
            first.observe(i, [float(rng.random() < 0.4) for _ in range(4)])
    saved = roundtrip(first.state_dict())
    resumed = SELECTORS.get(name)(ts, seed=7, **args)
    resumed.load_state_dict(saved)
    for _ in range(5):
        batch = first.select(8)
        assert resumed.select(8) == batch
        scores = [float(rng.random() < 0.4) for _ in range(4)]
        for i in batch:
            first.observe(i, scores)
            resumed.observe(i, scores)
    assert resumed.state_dict() == first.state_dict()


def test_a_state_saved_for_other_tasks_or_another_selector_is_refused():
    state = OnlineDifficulty(tasks(5), seed=0).state_dict()
    with pytest.raises(ValueError, match="num_tasks: saved 5, now 6"):
        OnlineDifficulty(tasks(6), seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="kind: saved 'OnlineDifficulty', now 'Uniform'"):
        SELECTORS.get("random")(tasks(5), seed=0).load_state_dict(state)


def source(name, n, weight, selector="shuffle", seed=0):
    ts = tasks(n, name)
    return TaskSource(name, ts, weight, SELECTORS.get(selector)(ts, seed=seed))


def test_mixing_ratios_hold_within_two_percent_over_1000_steps():
    feed = TaskFeed([source("a", 50, 0.5), source("b", 300, 0.3), source("c", 7, 0.2)])
    counts = {"a": 0, "b": 0, "c": 0}
    for _ in range(1000):
        for t in feed.next_batch(16):
            counts[t.taskset if t.taskset else t.task_id.split(":")[0]] += 1
    total = 16 * 1000
    for name, share in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        assert abs(counts[name] / total - share) < 0.02
        assert abs(counts[name] - share * total) <= 1  # the round robin is within one task at every point


def test_feed_hands_rollout_scores_to_the_tasks_selector_and_resumes():
    from trivium.types import Experience

    def exp(reward, accuracy=None):
        metrics = {} if accuracy is None else {"accuracy": accuracy}
        return Experience(
            torch.tensor([1, 2]),
            1,
            torch.ones(1, dtype=torch.bool),
            torch.zeros(1),
            reward=reward,
            metrics=metrics,
        )

    feed = TaskFeed(
        [source("a", 4, 1.0, "online_difficulty"), source("b", 4, 3.0, "online_difficulty", seed=1)]
    )
    b2 = feed.sources[1].tasks[2]
    feed.observe(
        b2, [exp(0.3, accuracy=1.0), exp(2.0), exp(-1.0)]
    )  # scores: accuracy 1, clip(2) 1, clip(-1) 0
    assert (feed.sources[1].selector.alpha[2], feed.sources[1].selector.beta[2]) == (3.0, 2.0)
    feed.next_batch(5)
    resumed = TaskFeed(
        [source("a", 4, 1.0, "online_difficulty"), source("b", 4, 3.0, "online_difficulty", seed=1)]
    )
    resumed.load_state_dict(roundtrip(feed.state_dict()))
    assert [t.task_id for t in resumed.next_batch(9)] == [t.task_id for t in feed.next_batch(9)]
    with pytest.raises(ValueError, match="task sets"):
        TaskFeed([source("a", 4, 1.0)]).load_state_dict(feed.state_dict())


def test_a_user_selector_by_module_path():
    class Reverse(TaskSelector):
        def select(self, n):
            return [len(self.tasks) - 1 - (k % len(self.tasks)) for k in range(n)]

    with SELECTORS.snapshot():
        SELECTORS.register("reverse")(Reverse)
        assert SELECTORS.get("reverse")(tasks(3)).select(4) == [2, 1, 0, 2]
    assert SELECTORS.get(f"{__name__}:Last")(tasks(3)).select(2) == [2, 2]


class Last(TaskSelector):
    def select(self, n):
        return [len(self.tasks) - 1] * n
