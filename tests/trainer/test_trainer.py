"""Trainer: old log-probs, micro-batch invariance, SFT progress, schedule, checkpoints."""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from trivium.config.schema import AlgorithmConfig, TrainerConfig
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.trainer.checkpoint import prune_checkpoints, save_checkpoint
from trivium.trainer.optim import lr_factor
from trivium.trainer.spec import AlgorithmSpec
from trivium.trainer.trainer import Trainer
from trivium.types import Experience


def sampled_experiences(model, tokenizer, n_prompts=4, group=4, seed=0):
    """Real rollouts from the engine, grouped, with rewards that vary inside each group."""
    engine = TransformersEngine(copy.deepcopy(model), tokenizer, device="cpu", dtype=torch.float32, seed=seed)
    prompts = [tokenizer(f"Tom has {i + 3} pens.")["input_ids"] for i in range(n_prompts)]
    params = SamplingParams(n=group, temperature=1.0, max_tokens=12)
    out = []
    for g, gens in enumerate(engine.generate(prompts, params)):
        for j, gen in enumerate(gens):
            resp = torch.tensor(gen.response_ids)
            out.append(
                Experience(
                    tokens=torch.cat([torch.tensor(gen.prompt_ids), resp]),
                    prompt_length=len(gen.prompt_ids),
                    action_mask=torch.ones(len(resp), dtype=torch.bool),
                    logprobs=torch.tensor(gen.logprobs),
                    reward=float((g + j) % 2),
                    group_id=g,
                    run_index=j,
                )
            )
    return out


def make_trainer(model, micro, algorithm="grpo", sgd=False, **cfg):
    tcfg = TrainerConfig(**{"lr": 1e-3, "micro_batch_size": micro, **cfg})
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type=algorithm))
    trainer = Trainer(model, tcfg, spec, pad_token_id=0, total_steps=10, max_response_length=12)
    if sgd:  # parameter change == -gradient: compares gradients (Adam would amplify float noise near 0)
        trainer.optim.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    return trainer


def test_micro_batch_split_does_not_change_the_update(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)  # 16 sequences of different lengths
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    ma = make_trainer(a, micro=16, sgd=True, grad_clip=0.0).train_step(exps)
    mb = make_trainer(b, micro=1, sgd=True, grad_clip=0.0).train_step(exps)
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-6)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), name
    assert not torch.allclose(next(a.parameters()), next(policy.parameters()))  # something was learned


def test_rollout_and_trainer_logprobs_agree(policy, tokenizer):
    metrics = make_trainer(policy, micro=4).train_step(sampled_experiences(policy, tokenizer))
    assert metrics["mismatch/logprob_abs_max"] < 1e-4
    assert metrics["policy/clip_fraction"] == 0.0  # one on-policy update: ratio 1 everywhere


def test_packed_batches_train_like_padded_ones(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    ma = make_trainer(a, micro=16, sgd=True, grad_clip=0.0).train_step(exps)
    mb = make_trainer(b, micro=16, sgd=True, grad_clip=0.0, pack_length=64).train_step(exps)
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-5)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-5)


def test_sft_lowers_the_nll_of_its_data(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    trainer = make_trainer(policy, micro=8, algorithm="sft", lr=1e-2)
    first = trainer.train_step(exps)["sft/nll"]
    for _ in range(10):
        last = trainer.train_step(exps)["sft/nll"]
    assert last < first - 0.5


def test_lr_schedule():
    cfg = TrainerConfig(lr=1.0, warmup_steps=4, lr_scheduler="cosine", min_lr_ratio=0.1)
    assert [lr_factor(s, 20, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 20, cfg) == pytest.approx(1.0)
    assert lr_factor(20, 20, cfg) == pytest.approx(0.1)
    assert lr_factor(12, 20, TrainerConfig(lr=1.0, warmup_steps=4, lr_scheduler="linear")) == pytest.approx(
        0.5
    )


def test_checkpoint_roundtrip_and_pruning(policy, tokenizer, tmp_path):
    trainer = make_trainer(policy, micro=8)
    trainer.train_step(sampled_experiences(policy, tokenizer))
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(root / f"step_{step}", trainer, tokenizer, trainer.state_dict(), {"step": step})
    prune_checkpoints(root, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_3"]
    loaded = AutoModelForCausalLM.from_pretrained(root / "step_3" / "model")
    for pa, pb in zip(policy.parameters(), loaded.parameters()):
        assert torch.equal(pa, pb)
    state = torch.load(root / "step_3" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 1 and state["optimizer"]["state"]  # Adam moments are saved
    assert json.loads((root / "step_3" / "meta.json").read_text())["step"] == 3
    assert not list(root.glob("*.tmp"))


def test_kl_loss_to_a_frozen_reference(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    ref = copy.deepcopy(policy).requires_grad_(False)
    spec = AlgorithmSpec.from_config(AlgorithmConfig(kl_loss={"coef": 0.5, "estimator": "k3"}))
    trainer = Trainer(policy, TrainerConfig(lr=1e-2), spec, pad_token_id=0, total_steps=3, ref_model=ref)
    first = trainer.train_step(exps)
    assert first["kl/mean"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    second = trainer.train_step(exps)
    assert second["kl/mean"] > 0 and second["loss/kl"] > 0
    with pytest.raises(ValueError, match="reference model"):
        Trainer(policy, TrainerConfig(), spec, pad_token_id=0, total_steps=1)


def test_make_tiny_cli(tmp_path):
    from trivium.cli import main as cli

    out = tmp_path / "tiny"
    assert (
        cli(
            [
                "make-tiny",
                str(out),
                "--hidden-size",
                "32",
                "--num-layers",
                "1",
                "--num-heads",
                "2",
                "--num-kv-heads",
                "1",
                "--intermediate-size",
                "64",
            ]
        )
        == 0
    )
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1


def test_ppo_critic_learns_values_and_is_checkpointed(policy, tokenizer, tmp_path):
    from trivium.config.schema import CriticConfig
    from trivium.trainer.critic import Critic, ValueModel

    exps = sampled_experiences(policy, tokenizer)
    tcfg = TrainerConfig(lr=1e-3, micro_batch_size=4)
    critic = Critic(
        ValueModel.from_causal_lm(policy),
        CriticConfig(lr=1e-2, warmup_steps=2),
        tcfg,
        total_updates=10,
        max_response_length=12,
    )
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="ppo"))
    before = copy.deepcopy(policy.state_dict())
    trainer = Trainer(
        policy, tcfg, spec, pad_token_id=0, total_steps=10, max_response_length=12, critic=critic
    )
    losses = [trainer.train_step(exps)["loss/value"] for _ in range(4)]
    assert losses[-1] < losses[0]  # the value head fits the returns
    assert "value/explained_variance" in trainer.train_step(exps)
    # warm-up: the first two steps trained only the critic
    assert trainer.step == 5
    state = trainer.state_dict()
    assert "critic" in state and state["critic"]["model"]
    trainer2 = Trainer(
        copy.deepcopy(policy),
        tcfg,
        spec,
        pad_token_id=0,
        total_steps=10,
        max_response_length=12,
        critic=Critic(ValueModel.from_causal_lm(policy), CriticConfig(warmup_steps=2), tcfg, 10, 12),
    )
    policy.load_state_dict(before)
    trainer2.model.load_state_dict(before)
    m = trainer2.train_step(exps)
    assert "train/grad_norm" not in m  # still warming up: no policy update
    assert all(torch.equal(a, b) for a, b in zip(trainer2.model.state_dict().values(), before.values()))


def test_rollout_importance_correction_weights_stale_samples(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    spec = AlgorithmSpec.from_config(AlgorithmConfig(rollout_is_cap=2.0))
    fresh = Trainer(copy.deepcopy(policy), TrainerConfig(), spec, pad_token_id=0, total_steps=2).train_step(
        exps
    )
    assert fresh["rollout_is/weight_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: weight 1
    # samples whose sampler found them e times less likely than the trainer does: weight e, capped at 2
    stale = [e.replace(logprobs=e.logprobs - 1.0) for e in exps]
    m = Trainer(copy.deepcopy(policy), TrainerConfig(), spec, pad_token_id=0, total_steps=2).train_step(stale)
    assert m["rollout_is/capped_fraction"] == pytest.approx(1.0)
    assert m["rollout_is/weight_mean"] == pytest.approx(2.0)


def test_rollout_correction_with_one_update_takes_no_extra_pass(policy, tokenizer, monkeypatch):
    """With one update per batch the correction's weight comes from the training forward itself (its
    detached log-probs are π_old): the same update as with a separate old-log-prob pass, one pass fewer."""
    exps = sampled_experiences(policy, tokenizer)
    gen = torch.Generator().manual_seed(0)  # a sampler 0 to 1.5 nats off per token: some weights capped
    stale = [e.replace(logprobs=e.logprobs - 1.5 * torch.rand(e.logprobs.shape, generator=gen)) for e in exps]
    spec = AlgorithmSpec.from_config(AlgorithmConfig(rollout_is_cap=2.0))
    tcfg = TrainerConfig(micro_batch_size=3)  # several micro-batches: the weight is taken in each
    one_pass = Trainer(copy.deepcopy(policy), tcfg, spec, pad_token_id=0, total_steps=2)
    two_pass = Trainer(copy.deepcopy(policy), tcfg, spec, pad_token_id=0, total_steps=2)
    before_update = Trainer._before_update
    monkeypatch.setattr(
        two_pass, "_before_update", lambda batch, single_update: before_update(two_pass, batch, False)
    )
    m1, m2 = one_pass.train_step(stale), two_pass.train_step(stale)
    assert "time/old_logprobs" in m2 and "time/old_logprobs" not in m1
    assert 0.05 < m1["rollout_is/capped_fraction"] < 0.95
    for key in ("rollout_is/weight_mean", "rollout_is/capped_fraction", "loss/policy"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(one_pass.model.parameters(), two_pass.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    moved = any(not torch.equal(a, b) for a, b in zip(one_pass.model.parameters(), policy.parameters()))
    assert moved


def test_m2po_masks_over_the_mini_batch_whatever_the_micro_batch_split(policy, tokenizer):
    """M2PO's second-moment mask compares every token of the mini-batch: split into micro-batches of one
    sequence, the update is the one of a single micro-batch (the trainer hands each its part of the mask)."""
    exps = sampled_experiences(policy, tokenizer)
    gen = torch.Generator().manual_seed(0)  # a sampler 0 to 0.6 nats off per token: some tokens very stale
    stale = [e.replace(logprobs=e.logprobs - 0.6 * torch.rand(e.logprobs.shape, generator=gen)) for e in exps]
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    ma = make_trainer(a, micro=16, algorithm="m2po", sgd=True, grad_clip=0.0).train_step(stale)
    mb = make_trainer(b, micro=1, algorithm="m2po", sgd=True, grad_clip=0.0).train_step(stale)
    assert 0 < ma["m2po/masked_fraction"] < 1
    assert ma["m2po/masked_fraction"] == pytest.approx(mb["m2po/masked_fraction"], abs=1e-6)
    assert ma["m2po/m2_after"] <= 0.04 + 1e-6
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), name
