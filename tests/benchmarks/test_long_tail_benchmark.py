"""benchmarks/long_tail.py's run and table code on the tiny model, two steps of each mode: the long-tail
workflow's delays happen, over-rollout cancels, and the figures come from real runs."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("long_tail_benchmark", REPO / "benchmarks" / "long_tail.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_delays_are_heavy_tailed_and_the_same_for_a_task_occurrence():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from long_tail_env import TAIL_CAP_S, delay_s

    draws = [delay_s(0, f"train:{i}", 0) for i in range(2000)]
    tail = [d for d in draws if d >= 2.0]
    assert 0.04 < len(tail) / len(draws) < 0.12 and max(draws) <= TAIL_CAP_S
    assert all(0.1 <= d <= 0.5 for d in draws if d < 2.0)
    assert delay_s(0, "train:3", 1) == delay_s(0, "train:3", 1) != delay_s(1, "train:3", 1)


@pytest.mark.integration
@pytest.mark.slow
def test_each_mode_runs_and_reports(bench, tiny_model_dir, tmp_path):
    args = argparse.Namespace(steps=2, tasks=4, threads=1)
    rows = []
    partial = "over-rollout + dynamic timeout + partial rollouts"
    for mode in ("sync", "over-rollout + dynamic timeout", partial):
        name = mode.replace(" + ", "-").replace(" ", "-")
        row = bench.run(bench.config(tiny_model_dir, tmp_path, name, 0, args, bench.MODES[mode]), 0)
        row.update(mode=mode, seed=0)
        rows.append(row)
    sync, over, ahead = rows
    assert sync["steps"] == over["steps"] == ahead["steps"] == 2 and sync["tasks"] == 8
    assert sync["cancelled_tasks"] == 0 and over["tasks"] == 10  # ceil(1.25 x 4) = 5 started a step
    assert over["experiences_trained"] == sync["experiences_trained"] == 2 * 4 * 8
    assert [len(r["curve"]) for r in rows] == [2, 2, 2] and sync["curve"][-1][0] == 2 * 4 * 8
    assert sync["in_flight_weight_loads"] == 0 and "token_staleness_mean" in ahead
    table = bench.markdown(rows, args)
    assert "| sync | 0 |" in table and "(1.00×)" in table
    assert f"| {partial} | 1 |" in table  # the per-mode summary over seeds
    bench.plot(rows, tmp_path / "long_tail.png")
    assert (tmp_path / "long_tail.png").stat().st_size > 10_000
