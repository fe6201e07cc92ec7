"""The shared-prompt layout (``trainer.share_prompts``): a prompt's samples in one row, the prompt once; the
same log-probs and the same update as one row a sample, and the rule that picks it."""

import copy
import dataclasses

import pytest
import torch
from tests.trainer.test_trainer import make_trainer, sampled_experiences

from trivium.config.schema import TrainerConfig
from trivium.trainer.layout import SHARE_AT, plan_shared_rows, why_not_shared
from trivium.trainer.logprobs import forward_logprobs
from trivium.types import Experience, collate, shared_prompt_mask, shared_prompt_rows


def experience(prompt, response, group=0, mask=None, reward=0.0):
    prompt, response = torch.tensor(prompt), torch.tensor(response)
    return Experience(
        tokens=torch.cat([prompt, response]),
        prompt_length=len(prompt),
        action_mask=torch.ones(len(response), dtype=torch.bool) if mask is None else torch.tensor(mask),
        logprobs=-torch.arange(1, len(response) + 1, dtype=torch.float32) / 10,
        reward=reward,
        group_id=group,
    )


def long_prompt_experiences(policy, tokenizer, n_prompts=3, group=4):
    """Sampled experiences whose prompts are long against their responses (where the layout pays), with
    responses of different lengths (rows with padding) and a non-action token (a multi-turn response)."""
    words = " ".join(f"Tom has {i} pens and gives {i + 1} away." for i in range(6))
    exps = sampled_experiences(policy, tokenizer, n_prompts=n_prompts, group=group)
    out = []
    for j, e in enumerate(exps):
        prompt = torch.tensor(tokenizer(f"{words} Case {e.group_id}:")["input_ids"])
        keep = [12, 5, 9, 1][j % 4]
        resp = e.tokens[e.prompt_length :][:keep]
        mask = torch.ones(keep, dtype=torch.bool)
        mask[keep // 2] = keep < 3  # one token not the model's, as an environment's reply in a multi-turn one
        lp = torch.where(mask, e.logprobs[:keep], 0.0)
        out.append(
            dataclasses.replace(
                e, tokens=torch.cat([prompt, resp]), prompt_length=len(prompt), action_mask=mask, logprobs=lp
            )
        )
    return out


def test_collate_lays_out_the_prompt_once_and_each_response_at_its_own_positions():
    exps = [
        experience([5, 6, 7], [8, 9]),
        experience([5, 6, 7], [10, 11, 12], mask=[1, 0, 1]),
        experience([4], [3]),
    ]
    rows = shared_prompt_rows(exps, 0)
    assert rows == [[0, 1], [2]]
    batch = collate(exps, pad_token_id=0, shared_rows=rows)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 7, 10, 11, 12], [4, 3, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert batch.segment_ids.tolist() == [[0, 0, 1, 1, 1, 2, 2, 2, 2], [1, 1, -1, -1, -1, -1, -1, -1, -1]]
    assert batch.seq_index.tolist() == [[-1, -1, 0, 0, 0, 1, 1, 1, 1], [2, 2, -1, -1, -1, -1, -1, -1, -1]]
    # target-aligned: a response token is a loss token where it is an action
    assert batch.loss_mask.int().tolist() == [[0, 0, 0, 1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.rollout_logprobs[0, 5:].tolist() == pytest.approx([0.0, -0.1, 0.0, -0.3])
    assert batch.attention_mask.tolist()[1] == [1, 1, 0, 0, 0, 0, 0, 0, 0]
    keep = shared_prompt_mask(batch.segment_ids)[0, 0]
    # the second response's tokens see the shared prompt [5, 6] and their own segment, not the first response
    assert keep[6].int().tolist() == [1, 1, 0, 0, 0, 1, 1, 0, 0]
    assert keep[3].int().tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    pad_row = shared_prompt_mask(batch.segment_ids)[1, 0]
    assert pad_row[4].int().tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0]  # padding attends to itself only
    assert batch.select_rows([1]).segment_ids.shape == (1, 9)
    assert batch.forward_rows(slice(None), 4).segment_ids.shape == (2, 4)


def test_rows_hold_what_fits_two_samples_at_least_and_never_mix_prompts():
    exps = [experience([1, 2, 3, 4], [9] * 3) for _ in range(5)] + [experience([1, 2, 3, 5], [9] * 3)]
    assert shared_prompt_rows(exps, 0) == [[0, 1, 2, 3, 4], [5]]
    # 3 prompt tokens + 4 a sample: 11 tokens hold two, 15 three
    assert shared_prompt_rows(exps, 11) == [[0, 1], [2, 3], [4], [5]]
    assert shared_prompt_rows(exps, 15) == [[0, 1, 2], [3, 4], [5]]
    assert shared_prompt_rows(exps, 2) == [[0, 1], [2, 3], [4], [5]]  # two at least, however small the budget
    with pytest.raises(ValueError, match="prompts differ"):
        collate(exps, 0, shared_rows=[[0, 5], [1], [2], [3], [4]])
    with pytest.raises(ValueError, match="exactly once"):
        collate(exps, 0, shared_rows=[[0, 1]])


def test_auto_shares_long_prompts_and_not_short_ones():
    long = [experience([g + 1, *range(10, 98)], [7] * 10, group=g) for g in range(2) for _ in range(4)]
    rows, metrics = plan_shared_rows(long, "auto", 4096)
    assert rows is not None and len(rows) == 2
    assert metrics == {
        "train/shared_prompt": 1.0,
        "train/shared_row_tokens": pytest.approx(2 * (88 + 44) / (8 * 99)),
    }
    short = [experience([1, 2, 3], [7] * 12) for _ in range(8)]  # (2 + 8 x 13) / 120 = 0.88
    rows, metrics = plan_shared_rows(short, "auto", 4096)
    assert rows is None and metrics["train/shared_prompt"] == 0.0
    assert metrics["train/shared_row_tokens"] > SHARE_AT
    assert plan_shared_rows(short, True, 4096)[0] == [list(range(8))]
    assert plan_shared_rows(long, False, 4096) == (None, {})
    distinct = [experience([g, 1, 2, 3, 4, 5], [7]) for g in range(4)]  # no prompt twice: nothing to share
    assert plan_shared_rows(distinct, True, 4096)[0] is None


def test_shared_rows_give_each_response_the_logprobs_and_gradients_of_its_own_row(policy, tokenizer):
    exps = long_prompt_experiences(policy, tokenizer)
    separate = collate(exps, 0)
    shared = collate(exps, 0, shared_rows=shared_prompt_rows(exps, 0))
    assert shared.num_rows == 3 and shared.input_ids.numel() < separate.input_ids.numel() / 2
    grads = []
    values = []
    for batch in (separate, shared):
        policy.zero_grad()
        lp, entropy = forward_logprobs(policy, batch, entropy=True)
        (lp * batch.loss_mask).sum().backward()
        grads.append([p.grad.clone() for p in policy.parameters()])
        values.append(
            [
                (lp[batch.seq_index == i] * batch.loss_mask[batch.seq_index == i]).tolist()
                for i in range(len(exps))
            ]
        )
        values[-1].append(entropy[batch.loss_mask].sum().item())
    for i in range(len(exps)):  # response tokens of sequence i, in order, in both layouts
        a = torch.tensor(values[0][i])[-exps[i].response_length :]
        b = torch.tensor(values[1][i])[-exps[i].response_length :]
        assert torch.allclose(a, b, atol=1e-5), i
        assert bool((a != 0).any()) or exps[i].num_action_tokens == 0
    assert values[0][-1] == pytest.approx(values[1][-1], rel=1e-5)
    for ga, gb in zip(*grads):
        assert torch.allclose(ga, gb, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_layers_share_one_additive_mask_that_the_backward_keeps(policy, tokenizer, autocast, monkeypatch):
    """sdpa turns a boolean mask into an additive one in every layer and keeps each for the backward; the
    trainer passes it additive in the attention's dtype, once (``TrainBatch.attention_inputs``)."""
    exps = long_prompt_experiences(policy, tokenizer)
    batch = collate(exps, 0, shared_rows=shared_prompt_rows(exps, 0))
    length = batch.input_ids.shape[1]
    layers = policy.config.num_hidden_layers
    assert layers >= 2

    def kept(pass_):
        storages = {}

        def pack(t):
            if t.shape[-2:] == (length, length):
                storages[t.untyped_storage().data_ptr()] = t.dtype
            return t

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with hooks, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            lp = pass_()
        return lp, storages

    with monkeypatch.context() as m:  # the boolean mask, as before
        m.setattr("trivium.trainer.logprobs.compute_dtype", lambda model: None)
        before, copies = kept(lambda: forward_logprobs(policy, batch)[0])
    assert len(copies) == layers  # what it costs with a boolean mask: one [L, L] a layer
    after, shared = kept(lambda: forward_logprobs(policy, batch)[0])
    assert list(shared.values()) == [torch.bfloat16 if autocast else torch.float32]
    assert torch.equal(after, before)  # sdpa's own conversion, made once


def test_a_train_step_on_shared_rows_makes_the_same_update(policy, tokenizer):
    exps = long_prompt_experiences(policy, tokenizer)
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    ma = make_trainer(a, micro=2, sgd=True, grad_clip=0.0, share_prompts=False).train_step(exps)
    mb = make_trainer(b, micro=2, sgd=True, grad_clip=0.0, share_prompts="auto").train_step(exps)
    assert "train/shared_prompt" not in ma
    assert mb["train/shared_prompt"] == 1.0 and mb["train/shared_row_tokens"] < SHARE_AT
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-6)
    assert ma["mismatch/logprob_abs_max"] == pytest.approx(mb["mismatch/logprob_abs_max"], abs=1e-5)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), name
    assert not torch.allclose(next(a.parameters()), next(policy.parameters()))


def test_a_trainer_that_cannot_share_says_why(policy, tiny_model_dir):
    assert why_not_shared(None, False, [policy]) is None
    assert "pack_length" in why_not_shared(64, False, [policy])
    assert "images" in why_not_shared(None, True, [policy])
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    assert "'eager' takes no boolean mask" in why_not_shared(None, False, [policy, None, eager])
    with pytest.raises(ValueError, match=r"share_prompts: true, but trainer\.pack_length"):
        make_trainer(policy, micro=2, share_prompts=True, pack_length=64)
    # auto with a trainer that cannot: one row a sample, no error
    trainer = make_trainer(eager, micro=2, share_prompts="auto")
    assert trainer._unshared is not None
    assert TrainerConfig(share_prompts="auto").share_prompts == "auto"
    with pytest.raises(ValueError):
        TrainerConfig(share_prompts="sometimes")


def ppo_step(policy, exps, sgd=True, **cfg):
    """One PPO step (policy and critic, fresh copies of ``policy``) under ``TrainerConfig(**cfg)``: its metrics,
    the trained policy and critic, and the trainer."""
    from trivium.config.schema import AlgorithmConfig, CriticConfig
    from trivium.trainer.critic import Critic, ValueModel
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer

    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="ppo"))
    tcfg = TrainerConfig(**{"lr": 1e-3, "grad_clip": 0.0, **cfg})
    model = copy.deepcopy(policy)
    critic = Critic(ValueModel.from_causal_lm(policy), CriticConfig(lr=1e-2, warmup_steps=0), tcfg, 10, 12)
    trainer = Trainer(
        model, tcfg, spec, pad_token_id=0, total_steps=10, max_response_length=12, critic=critic
    )
    if sgd:  # SGD: the change is the gradient (Adam would amplify noise)
        for opt in (trainer.optim, critic.optim):
            opt.optimizer = torch.optim.SGD(opt.optimizer.param_groups[0]["params"], lr=1e-2)
    return trainer.train_step(exps), (model, critic.model), trainer


def test_ppo_policy_and_critic_make_the_same_updates_on_shared_rows(policy, tokenizer):
    exps = long_prompt_experiences(policy, tokenizer)
    trained, metrics = [], []
    for share in (False, True):
        step, models, _ = ppo_step(policy, exps, micro_batch_size=2, share_prompts=share)
        metrics.append(step)
        trained.append(models)
    assert metrics[1]["train/shared_prompt"] == 1.0
    for key in ("loss/value", "train/loss", "value/explained_variance"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], abs=1e-5), key
    for a, b in zip(*trained):
        for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
            assert torch.allclose(pa, pb, atol=1e-6), name


def test_bf16_training_with_its_short_attention_takes_the_shared_mask(policy, tokenizer):
    exps = long_prompt_experiences(policy, tokenizer)
    metrics = []
    for share in (False, True):
        trainer = make_trainer(
            copy.deepcopy(policy), micro=2, grad_clip=0.0, share_prompts=share, precision="bf16"
        )
        assert trainer.model.config._attn_implementation == "trivium"  # models/attention.py's, mask and all
        metrics.append(trainer.train_step(exps))
    assert metrics[1]["train/shared_prompt"] == 1.0
    # bf16 rounding apart, the same log-probs: against the rollout's float32 ones, and the same loss
    assert metrics[1]["mismatch/logprob_abs_max"] == pytest.approx(
        metrics[0]["mismatch/logprob_abs_max"], abs=0.05
    )
    assert metrics[1]["train/loss"] == pytest.approx(metrics[0]["train/loss"], abs=2e-3)


def test_check_config_refuses_share_prompts_true_where_no_run_could_take_it():
    from pathlib import Path

    from trivium.config import ConfigError
    from trivium.validation.load import load_config

    quickstart = Path(__file__).resolve().parents[2] / "examples/quickstart/grpo_word_problems.yaml"
    assert load_config(quickstart, ["trainer.share_prompts=true"]).config.trainer.share_prompts is True
    with pytest.raises(ConfigError, match=r"(?s)trainer.share_prompts.*trainer.pack_length packs the rows"):
        load_config(quickstart, ["trainer.share_prompts=true", "trainer.pack_length=256"])


@pytest.mark.parametrize("micro", [2, 4])
def test_dpo_pairs_with_their_prompt_once_make_the_same_update(policy, tokenizer, micro):
    """A DPO pair as one row (the prompt, then the chosen and the rejected response): the same loss, metrics
    and update as two rows, whatever the micro-batch split."""
    from trivium.config.schema import DpoConfig
    from trivium.trainer.dpo import DpoTrainer
    from trivium.types import PreferencePair

    words = " ".join(f"Tom has {i} pens and gives {i + 1} away." for i in range(5))
    pairs = []
    for k in range(5):
        prompt = torch.tensor(tokenizer(f"{words} Case {k}:")["input_ids"])
        chosen = torch.tensor(tokenizer(f" He has {k} left.")["input_ids"])
        rejected = torch.tensor(tokenizer(" None" * (k + 1))["input_ids"])  # lengths differ: padding
        pairs.append(PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, pair_id=str(k)))
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    with torch.no_grad():  # a reference apart from the policy: log-ratios not all 0
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))
    trained, metrics = [], []
    for share in (False, True):
        model = copy.deepcopy(policy)
        tcfg = TrainerConfig(lr=1.0, micro_batch_size=micro, grad_clip=0.0, share_prompts=share)
        trainer = DpoTrainer(
            model, reference, tcfg, DpoConfig(beta=0.5, label_smoothing=0.1), pad_token_id=0, total_steps=4
        )
        trainer.optim.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        metrics.append(trainer.train_step(pairs))
        trained.append(model)
    assert "train/shared_prompt" not in metrics[0]
    assert metrics[1]["train/shared_prompt"] == 1.0 and metrics[1]["train/shared_row_tokens"] < SHARE_AT
    for key in metrics[0]:
        if key.startswith(("dpo/", "train/loss", "train/grad_norm")):
            assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-4, abs=1e-6), key
    for (name, pa), pb in zip(trained[0].named_parameters(), trained[1].parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), name
    assert not torch.allclose(next(trained[0].parameters()), next(policy.parameters()))
    # auto takes it for these long prompts; with an attention that takes no mask, true is refused
    eager = copy.deepcopy(policy)
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match=r"share_prompts: true, but the model's attention 'eager'"):
        DpoTrainer(
            eager, reference, TrainerConfig(share_prompts=True), DpoConfig(), pad_token_id=0, total_steps=1
        )
