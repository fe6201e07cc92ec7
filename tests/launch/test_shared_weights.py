"""The in-process rollout engine samples from the trainer's own weight tensors where nothing stands against it
(``build.why_rollout_copies_weights``): no copy of the model in memory, nothing copied at a sync, and a
seeded run gives the same records as with a copy."""

import logging

import pytest
import torch
import yaml
from tests.launch.conftest import config, write_task
from tests.launch.helpers import assert_same_records

from trivium.cli import main as cli
from trivium.config.schema import TriviumConfig
from trivium.launch import build
from trivium.launch.memory_estimate import ModelShape, Shapes, estimate
from trivium.models.tiny import make_tiny
from trivium.monitor.metrics import read_metrics


def stage_config(**fields) -> TriviumConfig:
    return TriviumConfig.model_validate({"model": {"device": "cpu"}, **fields})


def test_a_synchronous_stage_shares_and_every_blocker_is_named():
    assert build.why_rollout_copies_weights(stage_config()) == ""  # mode both: the defaults share
    assert build.why_rollout_copies_weights(stage_config(mode="train")) == ""  # SFT/DPO's eval engine
    blocked = {
        "sync_interval 2": {"synchronizer": {"sync_interval": 2}},
        "sync_offset 1": {"synchronizer": {"sync_offset": 1}},
        "method checkpoint": {"synchronizer": {"method": "checkpoint"}},
        "in_flight_updates": {"explorer": {"rollout": {"in_flight_updates": True}}},
        "engine_type vllm": {"explorer": {"rollout": {"engine_type": "vllm"}}},
        "model.lora": {"model": {"device": "cpu", "lora": {"rank": 4}}},
        "strategy ddp over 2": {"trainer": {"strategy": "ddp", "world_size": 2}},
        "backend ray": {"cluster": {"backend": "ray"}},
        "mode explore": {"mode": "explore"},
        "mode serve": {"mode": "serve"},
        "mode train": {"mode": "train", "buffer": {"storage": {}}},  # no engine in it
    }
    for expected, fields in blocked.items():
        why = build.why_rollout_copies_weights(stage_config(**fields))
        assert expected in why, (fields, why)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.models.conftest import synthetic_corpus

    path = make_tiny(tmp_path_factory.mktemp("shared") / "m", synthetic_corpus(60), hidden_size=32,
                     num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)  # fmt: skip
    from trivium.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(path, dtype=torch.float32, device="cpu"), load_tokenizer(path)


def engine_of(model):
    return model.engine  # BatchingRolloutModel -> TransformersEngine


def test_a_shared_engine_runs_on_the_trainer_tensors_in_a_module_tree_of_its_own(tiny):
    policy, tokenizer = tiny
    policy.train()
    rollout = build.build_rollout_model(policy, tokenizer, stage_config(), version=0, weights="share")
    engine = engine_of(rollout)
    theirs, ours = dict(policy.named_parameters()), dict(engine.model.named_parameters())
    assert theirs.keys() == ours.keys() and all(ours[k] is theirs[k] for k in theirs)
    assert engine.model is not policy and not engine.model.training and policy.training
    assert all(p.requires_grad for p in policy.parameters())  # the trainer's tensors still train
    # the trainer switching its attention leaves the engine's config alone
    policy.config._attn_implementation = "eager"
    assert engine.model.config._attn_implementation != "eager"

    # a "publish" of the trainer's weights moves only the version: nothing is loaded
    loads = []
    engine.model.load_state_dict = lambda *a, **k: loads.append(1)
    engine.update_weights(policy.state_dict(), 3)
    assert engine.version == 3 and loads == []
    # other tensors are still copied in (into the shared ones: they are the trainer's too)
    other = {k: v.clone() for k, v in policy.state_dict().items()}
    del engine.model.load_state_dict
    with torch.no_grad():
        other["model.norm.weight"].fill_(2.0)
    engine.update_weights(other, 4)
    assert engine.version == 4 and bool((policy.model.norm.weight == 2.0).all())


def test_a_step_of_the_trainer_is_what_the_engine_samples_from(tiny):
    """Greedy answers of the shared engine follow the trainer's in-place update, the copy's do not."""
    from trivium.models.protocol import SamplingParams

    policy, tokenizer = tiny
    shared = engine_of(build.build_rollout_model(policy, tokenizer, stage_config(), 0, weights="share"))
    copied = engine_of(build.build_rollout_model(policy, tokenizer, stage_config(), 0, weights="copy"))
    assert next(copied.model.parameters()) is not next(policy.parameters())
    prompt = [tokenizer("Tom has 3 pens.")["input_ids"]]
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=6)
    before = shared.generate(prompt, greedy)[0][0].logprobs
    assert before == copied.generate(prompt, greedy)[0][0].logprobs
    with torch.no_grad():  # an optimizer step, in place
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    after = shared.generate(prompt, greedy)[0][0].logprobs
    assert after != before and copied.generate(prompt, greedy)[0][0].logprobs == before


def test_a_rollout_dtype_of_its_own_gets_a_copy(tiny, caplog):
    policy, tokenizer = tiny
    cfg = stage_config(explorer={"rollout": {"dtype": "bfloat16"}})
    with caplog.at_level(logging.INFO, logger="trivium.launch.build"):
        engine = engine_of(build.build_rollout_model(policy, tokenizer, cfg, 0, weights="share"))
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    assert next(policy.parameters()).dtype == torch.float32
    assert "a bfloat16 copy of the float32 weights" in caplog.text


def test_the_estimate_counts_no_engine_weights_where_they_are_shared():
    shape = ModelShape(params=100_000_000, layers=12, hidden=768, heads=12, kv_heads=12, intermediate=3072,
                       head_dim=64, vocab=32_000)  # fmt: skip
    s = Shapes(experiences=16, rows_per_micro=4, seq_len=256, loss_tokens=128, in_flight=16, rollout_seq=256,
               trainable=shape.params, frozen_copies=0, rollout_shares_weights=True)  # fmt: skip
    shared = estimate(shape, s, "float32", "float32")
    assert "weights" not in shared.parts["rollout"]
    copied = estimate(shape, Shapes(**{**s.__dict__, "rollout_shares_weights": False}), "float32", "float32")
    assert copied.steady - shared.steady == pytest.approx(shape.params * 4)
    bf16 = estimate(shape, s, "float32", "bfloat16")  # a bf16 engine holds a copy of its own
    assert bf16.parts["rollout"]["weights"] == shape.params * 2


@pytest.mark.integration
def test_a_seeded_run_gives_the_same_records_shared_or_copied(tmp_path, monkeypatch, caplog):
    """SFT (its evaluation engine shared) then GRPO (mode both, shared): every record as with copies."""
    write_task(tmp_path)
    cfg = config(tmp_path, grpo_steps=4)
    cfg["stages"][0]["buffer"]["total_steps"] = 6
    cfg["stages"][1]["explorer"]["eval_at_start"] = True
    runs = []
    for name in ("shared", "copied"):
        cfg["name"] = name
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        if name == "copied":
            monkeypatch.setattr(build, "why_rollout_copies_weights", lambda cfg: "copies, for the test")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trivium.launch.build"):
            assert cli(["run", "--config", str(path)]) == 0
        shares = caplog.text.count("samples from the trainer's own weight tensors")
        assert shares == (2 if name == "shared" else 0), caplog.text  # the SFT stage's engine and GRPO's
        runs.append(read_metrics(tmp_path / "runs" / "e2e" / name))
    shared, copied = runs
    assert any("eval/test/accuracy" in r for r in shared if r["stage"] == "sft")
    assert len([r for r in shared if r["stage"] == "grpo" and "rollout/count" in r]) == 4
    assert all(r["sync/shared_weights"] == 1.0 for r in shared if "sync/seconds" in r)
    assert_same_records(shared, copied)  # (but for sync/shared_weights and the copy's checksum timings)


def test_a_memory_sync_into_a_shared_engine_verifies_nothing_and_a_copy_is_verified(tiny):
    from trivium.sync.memory import MemorySync

    policy, tokenizer = tiny
    for weights, expect_shared in (("share", True), ("copy", False)):
        rollout = build.build_rollout_model(policy, tokenizer, stage_config(), 0, weights=weights)
        record = MemorySync(rollout, verify=True).publish(policy.state_dict(), 7)
        assert rollout.version == 7
        assert ("sync/shared_weights" in record) == expect_shared
        assert ("sync/checksum_seconds" in record) == (not expect_shared)


def test_non_finite_weights_are_refused_and_a_sum_that_overflows_is_not_mistaken_for_them():
    from trivium.models.weights import WeightSyncError, check_finite

    big = torch.full((4,), 3e38)  # finite, but their sum is inf in float32
    check_finite({"w": big}, 1, "test")
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(WeightSyncError, match="w holds NaN or inf"):
            check_finite({"w": torch.tensor([1.0, bad, 2.0])}, 1, "test")
