"""SIGKILL at seeded random moments, then the same command again: nothing lost, nothing trained twice.

- in-memory queue (mode both): the resumed run's records equal an uninterrupted run's, every step;
- ``sync_offset: 1`` (the explorer runs ahead in a thread; which weights version a step samples with
  depends on thread timing, so records are compared by what was trained, not by value): one record per
  step, each step trained on exactly the experiences its explore step produced, and the explorer ends at
  the same task-set position and group-id counter as an uninterrupted run (no task skipped or repeated);
- SQL buffer and the decoupled explore/train pair (slow): every stored experience consumed once.
"""

import random

import pytest
from tests.launch.helpers import assert_same_records
from tests.launch.kills import (
    final_explorer_state,
    finish,
    grpo_config,
    kill_at_random_moment,
    run_dir,
    start,
    write,
)

from trivium.buffer.storage_sql import SqlStorage
from trivium.monitor.metrics import read_metrics

STEPS = 8
PER_STEP = 2 * 3  # tasks x samples


def _trained_steps(records):
    return [r for r in records if "train/loss" in r or "train/skipped_steps" in r]


def _kill_and_rerun(tmp_path, model_dir, data_dir, name, seed, **overrides):
    """Run ``name`` and an uninterrupted ``name-ref`` side by side, SIGKILL ``name`` at a seeded random
    moment, rerun it to the end; returns where it was killed and the rerun's stderr."""
    ref = write(tmp_path, grpo_config(tmp_path, model_dir, data_dir, f"{name}-ref", steps=STEPS, **overrides))
    path = write(tmp_path, grpo_config(tmp_path, model_dir, data_dir, name, steps=STEPS, **overrides))
    reference = start(ref)
    where = kill_at_random_moment(
        start(path), run_dir(tmp_path, name) / "metrics.jsonl", random.Random(seed), (1, STEPS - 2)
    )
    finish(reference)
    return where, finish(start(path))


@pytest.mark.integration
def test_memory_queue_killed_at_a_random_moment_resumes_equal_to_an_uninterrupted_run(
    tmp_path, tiny_model_dir, word_problem_dir
):
    where, err = _kill_and_rerun(tmp_path, tiny_model_dir, word_problem_dir, "mem", 13)
    assert "resuming from" in err, where
    got, want = read_metrics(run_dir(tmp_path, "mem")), read_metrics(run_dir(tmp_path, "mem-ref"))
    assert_same_records(got, want)  # same samples, same losses, same evals: nothing lost or repeated
    assert [r["step"] for r in _trained_steps(got)] == list(range(1, STEPS + 1)), where
    assert all(r["train/sequences"] == r["rollout/experiences"] == PER_STEP for r in _trained_steps(got))


@pytest.mark.integration
@pytest.mark.parametrize("in_flight", [False, True], ids=["updates-between-batches", "in-flight-updates"])
def test_explorer_running_ahead_killed_at_a_random_moment_trains_every_step_once(
    tmp_path, tiny_model_dir, word_problem_dir, in_flight
):
    """With in-flight updates (partial rollouts) the sync loads weights into generations still running:
    a kill then also lands among generations that span two versions; every step is still trained once."""
    sync = {"synchronizer": {"sync_offset": 1, "max_staleness": 1}}
    if in_flight:  # longer answers, so that the trainer's syncs land inside running generations
        sync["explorer"] = {"rollout": {"max_tokens": 24, "in_flight_updates": True}}
    where, err = _kill_and_rerun(tmp_path, tiny_model_dir, word_problem_dir, "ahead", 7, **sync)
    assert "resuming from" in err, where
    got = _trained_steps(read_metrics(run_dir(tmp_path, "ahead")))
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), where
    for r in got:
        assert r["train/sequences"] == r["rollout/experiences"] == PER_STEP, (where, r["step"])
        assert r["staleness/max"] <= 1 and r.get("staleness/dropped", 0) == 0
        assert r["staleness/token_max"] <= 1  # a token is never older than its sample's model_version
        assert ("rollout/in_flight_weight_loads" in r) == in_flight
    assert final_explorer_state(run_dir(tmp_path, "ahead"), "main", STEPS) == final_explorer_state(
        run_dir(tmp_path, "ahead-ref"), "main", STEPS
    )


@pytest.mark.integration
@pytest.mark.slow
def test_sql_buffer_killed_twice_at_random_moments_consumes_every_experience_once(
    tmp_path, tiny_model_dir, word_problem_dir
):
    rng = random.Random(3)
    storage = {"buffer": {"storage": {}}}
    ref = write(
        tmp_path, grpo_config(tmp_path, tiny_model_dir, word_problem_dir, "sql-ref", steps=STEPS, **storage)
    )
    path = write(
        tmp_path, grpo_config(tmp_path, tiny_model_dir, word_problem_dir, "sql", steps=STEPS, **storage)
    )
    reference = start(ref)
    progress = run_dir(tmp_path, "sql") / "metrics.jsonl"
    where = [kill_at_random_moment(start(path), progress, rng, (1, 3))]
    where.append(kill_at_random_moment(start(path), progress, rng, (4, STEPS - 2)))
    finish(reference)
    finish(start(path))
    assert_same_records(read_metrics(run_dir(tmp_path, "sql")), read_metrics(run_dir(tmp_path, "sql-ref")))
    with SqlStorage(run_dir(tmp_path, "sql") / "buffer.sqlite") as buffer:
        assert buffer.count() == buffer.count("consumed") == STEPS * PER_STEP, where
        assert buffer.count("ready") == buffer.count("claimed") == 0


@pytest.mark.integration
@pytest.mark.slow
def test_decoupled_pair_killed_at_random_moments_consumes_every_experience_once(
    tmp_path, tiny_model_dir, word_problem_dir
):
    """Explore and train processes, each SIGKILLed once at a random moment, restarted while the other runs."""
    rng = random.Random(5)
    cfg = grpo_config(
        tmp_path,
        tiny_model_dir,
        word_problem_dir,
        "pair",
        steps=STEPS,
        synchronizer={"method": "checkpoint", "wait_timeout_s": 120},
    )
    cfg["buffer"]["storage"] = {"read_timeout_s": 120}
    cfg["buffer"]["eval_tasksets"] = []
    path = write(tmp_path, cfg)
    folder = run_dir(tmp_path, "pair")
    explore, train = start(path, "--set", "mode=explore"), start(path, "--set", "mode=train")
    where = [kill_at_random_moment(train, folder / "metrics.train.jsonl", rng, (1, 4))]
    train = start(path, "--set", "mode=train")
    where.append(kill_at_random_moment(explore, folder / "metrics.explore.jsonl", rng, (3, STEPS - 2)))
    explore = start(path, "--set", "mode=explore")
    finish(train)
    finish(explore)
    records = read_metrics(folder)
    for role in ("train", "explore"):
        assert [r["step"] for r in records if r.get("role") == role] == list(range(1, STEPS + 1)), where
    with SqlStorage(folder / "buffer.sqlite") as buffer:
        assert buffer.count() == buffer.count("consumed") == STEPS * PER_STEP, where
