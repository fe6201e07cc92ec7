"""benchmarks/faults.py's run and table code on the tiny model, two steps: the figures it reports (failed
tasks, injections, failure records, experiences sampled and trained) come from a real faulty run."""

import argparse
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("faults_benchmark", REPO / "benchmarks" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
@pytest.mark.slow
def test_a_faulty_pair_member_reports_its_failures_and_trains_every_good_experience(
    bench, tiny_model_dir, tmp_path
):
    args = argparse.Namespace(steps=2, timeout=1.0, threads=1, retries=0)
    faults = {"workflow_raise": 0.3, "workflow_hang": 0.05}
    path = bench.config(tiny_model_dir, tmp_path, "faulty-s0", 0, args, faults)
    row = bench.run(path)
    tasks, group = bench.grpo_shape()  # the quickstart's GRPO stage: tasks per step, samples per task
    assert row["steps"] == 2 and row["tasks"] == 2 * tasks
    assert row["failed_tasks"] == row["injected_raise"] + row["injected_hang"] == row["failure_records"] > 0
    assert (
        row["experiences_sampled"] == row["experiences_trained"] == group * (2 * tasks - row["failed_tasks"])
    )
    assert 0 <= row["start_accuracy"] <= 1 and 0 <= row["final_accuracy"] <= 1
    row.update(kind="faulty", seed=0, load_before="0", load_after="0")
    clean = {**row, "kind": "clean", "final_accuracy": row["final_accuracy"] + 0.02}
    table = bench.markdown([clean, row], argparse.Namespace(steps=2, timeout=1.0, threads=1, retries=0))
    assert row["retries"] == 0 and "| faulty | 0 |" in table and "+2.0 points" in table
