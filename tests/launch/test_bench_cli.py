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


def test_latest_is_the_checkpoint_with_the_highest_global_step_not_the_newest_file(tmp_path):
    import json
    import os

    from trivium.launch.bench import find_checkpoints

    def checkpoint(stage, step, global_step, mtime):
        folder = tmp_path / stage / f"step_{step}"
        (folder / "model").mkdir(parents=True)
        if global_step is not None:
            (folder / "meta.json").write_text(
                json.dumps({"stage": stage, "step": step, "global_step": global_step})
            )
        os.utime(folder, (mtime, mtime))
        return folder / "model"

    sft = checkpoint("sft", 800, 800, mtime=3_000)  # copied last: the newest file
    grpo_50 = checkpoint("grpo", 50, 850, mtime=1_000)
    grpo_100 = checkpoint("grpo", 100, 900, mtime=2_000)
    assert find_checkpoints(tmp_path, "all") == [sft, grpo_50, grpo_100]
    assert find_checkpoints(tmp_path, "latest") == [grpo_100]
    # folders of step_N/model without meta.json (a user's checkpoint_dir): by N
    plain = tmp_path / "plain"
    for step in (20, 3, 100):
        (plain / f"step_{step}" / "model").mkdir(parents=True)
    assert [p.parent.name for p in find_checkpoints(plain, "all")] == ["step_3", "step_20", "step_100"]
