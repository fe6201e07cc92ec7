"""Mode bench over a run's checkpoints, and runs whose explorer overlaps the trainer (sync_offset > 0)."""

import pytest
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics


def config(folder, model_dir, data_dir, name, **sync):
    return {
        "project": "modes",
        "name": name,
        "checkpoint_root": str(folder / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {
            "rollout": {"max_tokens": 6},
            "eval_interval": 2,
            "eval_at_start": False,
            "eval": {"repeat_times": 2, "temperature": 1.0},
        },
        "monitor": {"progress_bar": False},
        "synchronizer": sync,
        "buffer": {
            "batch_size": 2,
            "total_steps": 4,
            "taskset": {"path": str(data_dir / "train.jsonl"), "repeat_times": 3},
            "eval_tasksets": [{"path": str(data_dir / "test.jsonl"), "name": "test", "max_rows": 4}],
        },
        "trainer": {"save_interval": 2, "keep_checkpoints": 5},
    }


def run(folder, cfg):
    path = folder / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    return folder / "runs" / "modes" / cfg["name"]


@pytest.mark.integration
def test_bench_stage_evaluates_base_and_every_checkpoint(tmp_path, tiny_model_dir, word_problem_dir):
    cfg = config(tmp_path, tiny_model_dir, word_problem_dir, "bench")
    cfg["stages"] = [{"name": "grpo"}, {"name": "bench", "mode": "bench"}]
    run_dir = run(tmp_path, cfg)
    records = [r for r in read_metrics(run_dir) if r["stage"] == "bench"]
    assert [r["model"] for r in records] == ["base", "grpo/step_2", "grpo/step_4"]
    for r in records:
        assert 0 <= r["eval/test/worst@2"] <= r["eval/test/mean@2"] <= r["eval/test/best@2"] <= 1
    table = (run_dir / "bench.md").read_text()
    assert "test mean@2" in table and "grpo/step_4" in table


@pytest.mark.integration
@pytest.mark.parametrize(("offset", "interval"), [(1, 1), (3, 2)])
def test_explorer_running_ahead(tmp_path, tiny_model_dir, word_problem_dir, offset, interval):
    cfg = config(
        tmp_path,
        tiny_model_dir,
        word_problem_dir,
        f"ahead{offset}",
        sync_offset=offset,
        sync_interval=interval,
        max_staleness=offset + interval - 1,
    )
    records = read_metrics(run(tmp_path, cfg))
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    versions = [r["rollout/model_version"] for r in steps]
    # explore step s samples with weights k * floor((s - 1 - o) / k) (or 0 before that is reached)
    expected = [
        max(0, interval * ((s - 1 - offset) // interval)) if s - 1 - offset >= 0 else 0 for s in range(1, 5)
    ]
    assert all(v >= e for v, e in zip(versions, expected))
    assert all(r["staleness/max"] <= offset + interval - 1 for r in steps)
    assert all(r.get("staleness/dropped", 0) == 0 for r in steps)
    assert any("eval/test/accuracy" in r for r in records)


@pytest.mark.integration
def test_m2po_trains_on_samples_from_older_weights(tmp_path, tiny_model_dir, word_problem_dir):
    """The explorer two steps ahead: M2PO measures each batch's staleness against the engine's log-probs
    and masks tokens until the second moment is within its bound."""
    cfg = config(tmp_path, tiny_model_dir, word_problem_dir, "m2po", sync_offset=2, max_staleness=2)
    # An untrained model earns no reward (zero advantages): the entropy bonus and a large lr move the weights,
    # so that stale tokens differ measurably from the trainer's.
    algorithm = {"algorithm_type": "m2po", "policy_loss_args": {"m2_threshold": 0.04}, "entropy_coef": 0.1}
    cfg["algorithm"] = algorithm
    cfg["trainer"]["lr"] = 2e-2
    steps = [r for r in read_metrics(run(tmp_path, cfg)) if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert max(r["staleness/max"] for r in steps) >= 1
    for r in steps:  # a batch so stale that no token is within the bound is masked whole (M2 after: 0)
        assert 0 <= r["m2po/masked_fraction"] <= 1
        assert r["m2po/m2_after"] <= 0.04 + 1e-6
        assert r["m2po/m2_before"] >= r["m2po/m2_after"]
    stale = [r for r in steps if r["staleness/max"] >= 1]  # batches sampled by older weights
    assert min(r["m2po/m2_before"] for r in stale) > 0
    assert max(r["m2po/masked_fraction"] for r in stale) > 0
