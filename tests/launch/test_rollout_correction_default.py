"""``algorithm.rollout_is_cap`` None (the default) turns truncated importance sampling on where the rollout
engine samples with weights in another dtype than the trainer's, and leaves it off elsewhere."""

import logging

import pytest

from trivium.config.schema import TriviumConfig
from trivium.launch import build


def run_config(**fields) -> TriviumConfig:
    return TriviumConfig.model_validate({"model": {"device": "cpu"}, **fields})


@pytest.mark.parametrize(
    ("fields", "fast_bf16", "cap"),
    [
        ({}, "1", 2.0),  # the default, explorer.rollout.dtype auto, on bf16 hardware: bf16 rollouts
        ({}, "0", 0.0),  # ... and elsewhere: float32 rollouts
        ({"explorer": {"rollout": {"dtype": None}}}, "1", 0.0),  # the policy's dtype
        ({"explorer": {"rollout": {"dtype": "bfloat16"}}}, "0", 2.0),  # asked for
        ({"explorer": {"rollout": {"autocast_dtype": "bfloat16"}}}, "0", 2.0),
        ({"explorer": {"rollout": {"dtype": "bfloat16"}}, "algorithm": {"rollout_is_cap": 0}}, "0", 0.0),
        ({"explorer": {"rollout": {"dtype": "bfloat16"}}, "algorithm": {"rollout_is_cap": 5}}, "0", 5.0),
    ],
)
def test_the_cap_follows_the_rollout_engines_dtype(fields, fast_bf16, cap, monkeypatch):
    monkeypatch.setenv("TRIVIUM_FAST_BF16", fast_bf16)
    cfg = run_config(**fields)
    trainer = build.make_trainer(cfg, policy_model(), pad_token_id=0, total=2)
    assert trainer.algorithm.rollout_is_cap == cap


def test_offline_algorithms_and_the_log(monkeypatch, caplog):
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    sft = run_config(
        mode="train", algorithm={"algorithm_type": "sft"}, explorer={"rollout": {"dtype": "bfloat16"}}
    )
    assert build.make_trainer(sft, policy_model(), pad_token_id=0, total=2).algorithm.rollout_is_cap == 0.0
    with caplog.at_level(logging.INFO, logger="trivium.launch.rollout_correction"):
        build.make_trainer(
            run_config(explorer={"rollout": {"dtype": "bfloat16"}}), policy_model(), pad_token_id=0, total=2
        )
    assert (
        "algorithm.rollout_is_cap None -> 2: the rollout engine samples with bfloat16 weights" in caplog.text
    )
    assert "trainer's weights are float32" in caplog.text


def policy_model():
    from transformers import Qwen2ForCausalLM

    from trivium.models.tiny import architecture_config

    shape = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}
    return Qwen2ForCausalLM(architecture_config("qwen2", vocab_size=32, **shape)).float()


def test_the_doctor_says_the_trainer_corrects_a_bf16_sampler(tmp_path, monkeypatch):
    import yaml

    from trivium.launch.config_doctor import explain
    from trivium.validation import load_config

    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    data = tmp_path / "t.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n' * 4)
    cfg = {
        "model": {"tiny": {"corpus": [str(data)], "vocab_size": 300}},
        "buffer": {"batch_size": 2, "total_steps": 1, "taskset": {"path": str(data), "repeat_times": 2}},
    }
    for rollout, algorithm, says in [
        (
            {"dtype": "bfloat16"},
            {},
            "min(pi_trainer / pi_rollout, 2) (algorithm.rollout_is_cap unset: on for",
        ),
        ({"dtype": "bfloat16"}, {"rollout_is_cap": 0}, None),
        ({}, {}, None),  # the policy's dtype: nothing to correct
        ({}, {"rollout_is_cap": 3}, "min(pi_trainer / pi_rollout, 3) (algorithm.rollout_is_cap)"),
    ]:
        (tmp_path / "c.yaml").write_text(
            yaml.safe_dump({**cfg, "explorer": {"rollout": rollout}, "algorithm": algorithm})
        )
        text, _ = explain(load_config(tmp_path / "c.yaml"))
        (line,) = [x for x in text.splitlines() if x.startswith("  rollout  ")]
        assert (says in line) if says else ("pi_rollout" not in line), (rollout, algorithm, line)
