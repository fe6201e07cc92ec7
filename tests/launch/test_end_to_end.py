"""End to end through `trivium run`: SFT then GRPO on the tiny task of conftest.py; reward must go up."""

import json

import pytest
import yaml
from tests.launch.helpers import assert_same_records

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics
from trivium.monitor.phases import PEAK_RSS


@pytest.mark.integration
@pytest.mark.parametrize("rollout_dtype", [None, "bfloat16"], ids=["fp32", "bf16-rollouts"])
def test_sft_then_grpo_reward_goes_up(e2e, tmp_path, rollout_dtype):
    """With bf16 rollouts (explorer.rollout.dtype) under the fp32 trainer it learns as well; the sync check
    compares the engine with the trainer's weights cast to bf16, and the gap shows in the mismatch metric."""
    e2e.write(tmp_path)
    cfg_path = tmp_path / "run.yaml"
    cfg = e2e.config(tmp_path)
    cfg["explorer"]["rollout"]["dtype"] = rollout_dtype
    phase_memory = rollout_dtype is not None  # one of the two runs logs rss/<phase> too
    cfg.setdefault("monitor", {})["phase_memory"] = phase_memory
    cfg_path.write_text(yaml.safe_dump(cfg))
    try:
        assert cli(["run", "--config", str(cfg_path)]) == 0
    finally:
        PEAK_RSS.enable(False)  # process-wide: later tests in this process run without it
    run_dir = tmp_path / "runs" / "e2e" / "codes"
    records = read_metrics(run_dir)
    grpo = [r for r in records if r["stage"] == "grpo"]
    rss = [r for r in records if any(k.startswith("rss/") for k in r)]
    if not phase_memory:
        assert not rss
    else:
        for r in grpo:
            assert {"rss/rollout", "rss/train", "rss/forward_backward", "rss/optimizer", "rss/sync"} <= set(r)
            # a phase's peak covers its nested phases', and the process's peak covers every phase's
            assert r["rss/train"] >= r["rss/forward_backward"] > 100  # MB: torch and the models at least
            # (read in the optimizer phase: it covers the training passes before it)
            assert r["train/peak_rss_mb"] >= r["rss/forward_backward"]
        assert any("rss/eval" in r for r in grpo)
    rewards = [r["rollout/reward_mean"] for r in grpo]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.15, f"reward did not go up: {rewards}"
    sft_acc = [r["eval/test/accuracy"] for r in records if r["stage"] == "sft" and "eval/test/accuracy" in r]
    end_acc = grpo[-1]["eval/test/accuracy"]
    assert end_acc > sft_acc[-1], (sft_acc, end_acc)
    # every step logged the rollout/trainer mismatch, and the final checkpoints are complete
    gap = max(r["mismatch/logprob_abs_max"] for r in grpo)
    assert (gap > 1e-3) if rollout_dtype else (gap < 1e-3), gap
    assert all("sync/checksum_seconds" in r for r in grpo)  # every sync verified both sides equal
    assert (run_dir / "checkpoints" / "grpo" / "step_40" / "model" / "model.safetensors").exists()
    assert cli(["plot", str(run_dir)]) == 0
    assert (run_dir / "curves.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.integration
def test_seeded_runs_are_reproducible(e2e, tmp_path):
    """Two runs of the same config produce the same metrics, step for step (timings aside)."""
    e2e.write(tmp_path)
    curves = []  # records of run a, then of run b
    for name in ("a", "b"):
        cfg = e2e.config(tmp_path, grpo_steps=8)
        cfg["name"] = name
        cfg_path = tmp_path / f"{name}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        assert cli(["run", "--config", str(cfg_path)]) == 0
        curves.append(read_metrics(tmp_path / "runs" / "e2e" / name))
    assert_same_records(*curves)  # timings aside


def test_bad_row_in_a_later_stage_fails_before_training(e2e, tmp_path, capsys):
    e2e.write(tmp_path)
    with (tmp_path / "train.jsonl").open("a") as f:
        f.write(json.dumps({"question": "   ", "answer": "#### 1"}) + "\n")
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(e2e.config(tmp_path)))
    assert cli(["run", "--config", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "train.jsonl" in err and "question" in err and "257" in err  # file, field, line
    assert "on_bad_row" in err  # and what to do
    assert not (tmp_path / "runs" / "e2e" / "codes" / "base_model").exists()  # no model was made
