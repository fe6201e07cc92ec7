"""Right-padded rows train under causal attention alone (no padding mask): the same log-probs and gradients,
and sdpa runs with ``is_causal`` (its CPU flash kernel then skips the blocks above the diagonal)."""

import dataclasses

import torch
from tests.trainer.test_trainer import sampled_experiences

from trivium.trainer.critic import ValueModel
from trivium.trainer.logprobs import forward_logprobs
from trivium.types import collate


def padded_batch(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer, n_prompts=3, group=2)
    exps = [  # rows of different lengths, so that most carry padding
        dataclasses.replace(
            e, tokens=e.tokens[: e.prompt_length + k], action_mask=e.action_mask[:k], logprobs=e.logprobs[:k]
        )
        for e, k in zip(exps, [12, 3, 7, 12, 1, 5])
    ]
    batch = collate(exps, 0)
    assert bool((batch.attention_mask == 0).any())
    return exps, batch


def test_right_padded_rows_drop_the_mask_and_count_positions_on(policy, tokenizer):
    _, batch = padded_batch(policy, tokenizer)
    inputs = batch.attention_inputs()
    assert inputs["attention_mask"] is None
    width = batch.input_ids.shape[1]
    assert torch.equal(inputs["position_ids"], torch.arange(width).expand(batch.num_rows, width))
    assert batch.model_inputs()["attention_mask"] is None


def test_other_masks_are_kept(policy, tokenizer):
    exps, batch = padded_batch(policy, tokenizer)
    left = batch.attention_mask.flip(1)  # left padding: the real tokens are not a prefix
    kept = dataclasses.replace(batch, attention_mask=left).attention_inputs()
    assert kept["attention_mask"] is left and kept["position_ids"] is batch.position_ids
    shifted = dataclasses.replace(batch, position_ids=batch.position_ids + 1)  # positions not from 0
    assert shifted.attention_inputs()["attention_mask"] is batch.attention_mask
    packed = collate(exps, 0, pack_length=40)  # restarting positions make transformers' block-causal mask
    assert packed.attention_inputs() == {"attention_mask": None, "position_ids": packed.position_ids}


def test_causal_only_gives_each_row_its_own_unpadded_logprobs_and_gradients(policy, tokenizer):
    exps, batch = padded_batch(policy, tokenizer)
    mask = batch.loss_mask
    policy.zero_grad()
    lp, _ = forward_logprobs(policy, batch)
    lp[mask].sum().backward()
    grads = [p.grad.clone() for p in policy.parameters()]
    for r, e in enumerate(exps):  # each sequence alone: no padding at all
        alone, _ = forward_logprobs(policy, collate([e], 0))
        n = e.tokens.numel()
        assert torch.allclose(lp[r, :n], alone[0], atol=1e-5)
    # the gradients equal those of the explicit padding mask's pass
    policy.zero_grad()
    explicit = policy(
        **{"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}, use_cache=False
    )
    logits = explicit.logits[:, :-1].float().log_softmax(-1)
    picked = logits.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    picked[mask[:, 1:]].sum().backward()
    for g, p in zip(grads, policy.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-5)


def test_sdpa_runs_causally_for_the_policy_and_the_critic(policy, tokenizer, monkeypatch):
    _, batch = padded_batch(policy, tokenizer)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    assert policy.config._attn_implementation == "sdpa"
    forward_logprobs(policy, batch)
    ValueModel.from_causal_lm(policy)(batch)
    layers = policy.config.num_hidden_layers
    assert calls == [(None, True)] * (2 * layers)
