"""End to end through `trivium run`: SFT then GRPO on the tiny task of conftest.py; reward must go up."""

import json

import pytest
import yaml
from tests.launch.conftest import config, write_task
from tests.launch.helpers import assert_same_records

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics
from trivium.monitor.phases import PEAK_RSS


def run_e2e(folder, rollout_dtype=None, precision="auto", phase_memory=False):
    """SFT then GRPO on conftest.py's tiny task through `trivium run`; (run folder, metric records)."""
    write_task(folder)
    cfg = config(folder)
    cfg["explorer"]["rollout"]["dtype"] = rollout_dtype
    cfg["trainer"] = {"precision": precision}  # every stage (a stage's own trainer section adds its lr)
    cfg.setdefault("monitor", {})["phase_memory"] = phase_memory
    cfg_path = folder / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    try:
        assert cli(["run", "--config", str(cfg_path)]) == 0
    finally:
        PEAK_RSS.enable(False)  # process-wide: later tests in this process run without it
    run_dir = folder / "runs" / "e2e" / "codes"
    return run_dir, read_metrics(run_dir)


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory):
    """The fp32 run (auto is fp32 in the suite: tests/conftest.py), made once for the tests that read it."""
    return run_e2e(tmp_path_factory.mktemp("e2e_fp32"))


def learning(records):
    """(rollout reward of the first 4 GRPO steps, of the last 4, SFT model's accuracy, final accuracy)."""
    grpo = [r for r in records if r["stage"] == "grpo"]
    rewards = [r["rollout/reward_mean"] for r in grpo]
    sft_acc = [r["eval/test/accuracy"] for r in records if r["stage"] == "sft" and "eval/test/accuracy" in r]
    return sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4, sft_acc[-1], grpo[-1]["eval/test/accuracy"]


def final_sft_loss(records, last=10):
    """The SFT stage's mean ``sft/nll`` over its ``last`` steps."""
    nll = [r["sft/nll"] for r in records if r["stage"] == "sft" and "sft/nll" in r]
    return sum(nll[-last:]) / len(nll[-last:])


def check_learned_and_complete(run_dir, records, bf16_somewhere=False, engine_copy=False):
    grpo = [r for r in records if r["stage"] == "grpo"]
    first, last, sft_acc, end_acc = learning(records)
    assert last > first + 0.15, f"reward did not go up: {[r['rollout/reward_mean'] for r in grpo]}"
    assert end_acc > sft_acc, (sft_acc, end_acc)
    # every step logged the rollout/trainer mismatch, and the final checkpoints are complete
    gap = max(r["mismatch/logprob_abs_max"] for r in grpo)
    # (fp32 on both sides: the same numbers; bf16 rollouts or a bf16 trainer: a bf16-sized gap)
    assert (1e-3 < gap < 0.5) if bf16_somewhere else (gap < 1e-3), gap
    if engine_copy:  # every sync verified both sides equal
        assert all("sync/checksum_seconds" in r for r in grpo)
    else:  # the engine samples from the trainer's own tensors: nothing copied, nothing to verify
        assert all(r["sync/shared_weights"] == 1.0 and "sync/checksum_seconds" not in r for r in grpo)
    assert (run_dir / "checkpoints" / "grpo" / "step_40" / "model" / "model.safetensors").exists()
    assert cli(["plot", str(run_dir)]) == 0
    assert (run_dir / "curves.png").stat().st_size > 10_000


@pytest.mark.integration
def test_sft_then_grpo_reward_goes_up(fp32_run):
    run_dir, records = fp32_run
    assert not any(k.startswith("rss/") for r in records for k in r)  # phase memory is off by default
    check_learned_and_complete(run_dir, records)


@pytest.mark.integration
def test_bf16_rollouts_learn_and_log_their_gap(tmp_path):
    """With bf16 rollouts (explorer.rollout.dtype) under the fp32 trainer it learns as well; the sync check
    compares the engine with the trainer's weights cast to bf16, and the gap shows in the mismatch metric.
    This run also logs rss/<phase> (monitor.phase_memory)."""
    run_dir, records = run_e2e(tmp_path, rollout_dtype="bfloat16", phase_memory=True)
    for r in (r for r in records if r["stage"] == "grpo"):
        assert {"rss/rollout", "rss/train", "rss/forward_backward", "rss/optimizer", "rss/sync"} <= set(r)
        # a phase's peak covers its nested phases', and the process's peak covers every phase's
        assert r["rss/train"] >= r["rss/forward_backward"] > 100  # MB: torch and the models at least
        # (read in the optimizer phase: it covers the training passes before it)
        assert r["train/peak_rss_mb"] >= r["rss/forward_backward"]
    assert any("rss/eval" in r for r in records if r["stage"] == "grpo")
    # algorithm.rollout_is_cap unset: on (2) for a bf16 engine, weights near 1 at this gap, in the one pass
    for r in (r for r in records if r["stage"] == "grpo"):
        assert 0.9 < r["rollout_is/weight_mean"] < 1.1 and "time/old_logprobs" not in r
    check_learned_and_complete(run_dir, records, bf16_somewhere=True, engine_copy=True)


@pytest.mark.integration
def test_bf16_trainer_learns_as_well_as_fp32(fp32_run, tmp_path, caplog):
    """trainer.precision: bf16 in every stage (SFT and GRPO), forced so that it runs on every CPU: bf16
    numerics through models/bf16.py's emulation where the CPU has no bf16 instructions, native elsewhere.
    It learns by the same bars as the fp32 run, and not much less (the path `auto` takes on bf16 hardware;
    issue 23). One pair of runs of this 40-step task differs by up to ~14 points of mean GRPO reward in
    either direction (measured: fp32 0.661, bf16 0.796 on one CPU; on another the order can flip), so the
    margin is 20 points; the quickstart's mean over seeds is benchmarks/precision.py's to measure. The SFT
    stage is compared by its loss, not its accuracy: half of each word's demonstrations are wrong
    (conftest.py), so the SFT model puts about half its mass on each of two digits, and which one greedy
    decoding picks is a coin flip per word that any rounding decides (measured: SFT accuracy fp32 0.547 /
    bf16 0.453 on an AVX-512-BF16 CPU, fp32 0.703 / bf16 0.297 on an AVX2 one, with final losses 0.221 and
    0.214 on the latter). The loss at the end of SFT (mean of the last 10 steps) must be within 10% of fp32's."""
    with caplog.at_level("INFO", logger="trivium.trainer.trainer"):
        run_dir, records = run_e2e(tmp_path, precision="bf16")
    assert caplog.text.count("trainer.precision bf16 -> bf16") == 2  # the SFT stage's trainer and GRPO's
    check_learned_and_complete(run_dir, records, bf16_somewhere=True)  # fp32 rollouts: shared weights
    assert not any("rollout_is/weight_mean" in r for r in records)  # the engine's dtype is the policy's
    nll, f_nll = final_sft_loss(records), final_sft_loss(fp32_run[1])
    assert nll <= 1.1 * f_nll, (nll, f_nll)  # the SFT stage in bf16 learns as fp32's does
    mean = mean_grpo_reward(records)
    assert mean >= mean_grpo_reward(fp32_run[1]) - 0.2, (mean, mean_grpo_reward(fp32_run[1]))


def mean_grpo_reward(records) -> float:
    """The mean rollout reward over the whole GRPO stage: the area under its learning curve, less noisy
    than any one step's."""
    rewards = [r["rollout/reward_mean"] for r in records if r["stage"] == "grpo"]
    return sum(rewards) / len(rewards)


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
