"""Every algorithm preset runs end to end through `trivium run` (a few steps on a tiny model)."""

import json

import pytest
import yaml

from trivium.algorithm.presets import PRESETS
from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics

# gigpo groups the turns of multi-turn episodes: it runs on FrozenLake's step-wise episodes in
# tests/launch/test_agent_runs.py (these word problems are one turn each).
ONLINE = sorted(name for name, p in PRESETS.items() if p.needs_rollouts and name != "gigpo")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir, word_problem_dir):
    folder = tmp_path_factory.mktemp("presets")
    rows = [json.loads(x) for x in (word_problem_dir / "sft.jsonl").read_text().splitlines()]
    pairs = [{"prompt": r["question"], "chosen": r["answer"], "rejected": r["answer"] + "1"} for r in rows]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return folder


def base_config(folder, model_dir, data_dir, name):
    return {
        "project": "presets",
        "name": name,
        "checkpoint_root": str(folder / "runs"),
        "model": {"path": str(model_dir)},
        "auxiliary_models": [{"name": "teacher", "path": str(model_dir)}],
        "explorer": {"rollout": {"max_tokens": 6}, "eval_interval": 0, "eval_at_start": False},
        "monitor": {"progress_bar": False},
        "buffer": {
            "batch_size": 2,
            "total_steps": 2,
            "taskset": {"path": str(data_dir / "train.jsonl"), "repeat_times": 3},
            "eval_tasksets": [{"path": str(data_dir / "test.jsonl"), "name": "test", "max_rows": 4}],
        },
    }


def run(folder, cfg):
    path = folder / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    return read_metrics(folder / "runs" / "presets" / cfg["name"])


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ONLINE)
def test_each_online_preset_trains_two_steps_and_evaluates(
    setup, tiny_model_dir, word_problem_dir, algorithm
):
    """Plumbing: every online preset builds, trains and evaluates through `trivium run` (learning is shown
    by the quickstart and the algorithm tests, not here)."""
    cfg = base_config(setup, tiny_model_dir, word_problem_dir, algorithm)
    cfg["algorithm"] = {"algorithm_type": algorithm}
    if PRESETS.get(algorithm).sample_strategy == "mix":
        cfg["buffer"]["expert_dataset"] = {
            "path": str(word_problem_dir / "sft.jsonl"),
            "fields": {"prompt": "question", "response": "answer"},
        }
        cfg["buffer"]["expert_per_step"] = 2
    records = run(setup, cfg)
    last = records[-1]
    assert last["step"] == 2 and "train/loss" in last and "eval/test/accuracy" in last
    if PRESETS.get(algorithm).needs_critic:
        assert "value/explained_variance" in last


@pytest.mark.integration
def test_dpo_and_messages_sft_run(setup, tiny_model_dir, word_problem_dir):
    cfg = base_config(setup, tiny_model_dir, word_problem_dir, "dpo")
    cfg.update(mode="train", algorithm={"algorithm_type": "dpo"})
    cfg["buffer"]["preference_dataset"] = {"path": str(setup / "pairs.jsonl")}
    records = run(setup, cfg)
    first, last = records[0], records[-1]
    assert [r["train/skipped_updates"] for r in records if "dpo/loss" in r] == [0.0, 0.0]
    assert first["rewards/margin"] == 0.0  # the policy starts as the reference
    assert first["dpo/loss"] == pytest.approx(0.693147, abs=1e-4)  # ln 2
    assert last["dpo/loss"] < first["dpo/loss"]

    rows = [json.loads(x) for x in (word_problem_dir / "sft.jsonl").read_text().splitlines()]
    chats = [
        {
            "messages": [
                {"role": "user", "content": r["question"]},
                {"role": "assistant", "content": r["answer"]},
                {"role": "user", "content": "Sure?"},
                {"role": "assistant", "content": "Yes."},
            ]
        }
        for r in rows
    ]
    (setup / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    cfg = base_config(setup, tiny_model_dir, word_problem_dir, "chat-sft")
    cfg.update(mode="train", algorithm={"algorithm_type": "sft"})
    cfg["buffer"]["sft_dataset"] = {"path": str(setup / "chats.jsonl"), "format": "messages"}
    records = run(setup, cfg)
    assert records[-1]["sft/nll"] > 0


DPO_INERT = {
    "algorithm.kl_loss.coef": 0.1,
    "algorithm.entropy_coef": 0.01,
    "algorithm.rollout_is_cap": 2.0,
    "trainer.ppo_epochs": 2,
    "trainer.mini_batch_size": 1,
    "trainer.pack_length": 256,
}


def test_dpo_refuses_the_keys_its_trainer_does_not_read(setup, tiny_model_dir, word_problem_dir):
    """trainer/dpo.py reads none of these: each is refused by name (it was accepted and did nothing)."""
    from trivium.config import ConfigError, apply_overrides
    from trivium.validation import validate_raw

    cfg = base_config(setup, tiny_model_dir, word_problem_dir, "dpo-inert")
    cfg.update(mode="train", algorithm={"algorithm_type": "dpo"})
    cfg["buffer"]["preference_dataset"] = {"path": str(setup / "pairs.jsonl")}
    validate_raw(cfg, setup)  # the defaults pass
    raw = apply_overrides(cfg, [f"{k}={v}" for k, v in DPO_INERT.items()])
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, setup)
    problems = {p.path: p for p in info.value.problems}
    assert set(problems) == set(DPO_INERT)
    assert "algorithm.dpo.beta" in problems["algorithm.kl_loss.coef"].rule
    assert all(p.fix.startswith(f"remove {path}") for path, p in problems.items())


@pytest.mark.integration
def test_dpo_skips_updates_with_an_absurd_gradient_and_stops_after_max_bad_steps(
    setup, tiny_model_dir, word_problem_dir
):
    """As the RL and SFT trainer: a skipped update is reported (train/skipped_updates) and counted, and
    trainer.max_bad_steps of them in a row stop the run (they were silently not made)."""
    cfg = base_config(setup, tiny_model_dir, word_problem_dir, "dpo-bad")
    cfg.update(mode="train", algorithm={"algorithm_type": "dpo"})
    cfg["buffer"]["preference_dataset"] = {"path": str(setup / "pairs.jsonl")}
    cfg["buffer"]["total_steps"] = 4
    cfg["trainer"] = {"skip_grad_norm": 1e-12, "max_bad_steps": 2}  # every norm is "absurd"
    path = setup / "dpo-bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 1  # TrainingDiverged: the message names the way out
    records = [r for r in read_metrics(setup / "runs" / "presets" / "dpo-bad") if "dpo/loss" in r]
    assert [(r["step"], r["train/skipped_updates"]) for r in records] == [(1, 1.0)]
