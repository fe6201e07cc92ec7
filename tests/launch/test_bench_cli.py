"""`trivium bench CONFIG`: the short form of mode bench, over CONFIG's own run, in a run folder of its own."""

import pytest
from tests.launch.test_bench_and_overlap_runs import config, run

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics


@pytest.mark.integration
def test_trivium_bench_evaluates_a_runs_base_model_and_checkpoints(
    tmp_path, tiny_model_dir, word_problem_dir
):
    cfg = config(tmp_path, tiny_model_dir, word_problem_dir, "trained")
    run_dir = run(tmp_path, cfg)
    before = read_metrics(run_dir)
    path = tmp_path / "trained.yaml"
    assert cli(["bench", str(path), "--checkpoints", "latest"]) == 0
    bench_dir = run_dir.parent / "trained-bench"
    checkpoints = sorted(p.parent.name for p in (run_dir / "checkpoints").glob("*/step_*/model"))
    records = read_metrics(bench_dir)
    assert [r["model"].rsplit("/", 1)[-1] for r in records] == ["base", checkpoints[-1]]
    assert all(0 <= r["eval/test/mean@2"] <= 1 for r in records)
    assert "test mean@2" in (bench_dir / "bench.md").read_text()
    assert read_metrics(run_dir) == before  # the training run's folder is left as it was
    assert cli(["bench", str(tmp_path / "missing.yaml")]) == 2
