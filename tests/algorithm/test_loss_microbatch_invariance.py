"""Gradient accumulation is exact for every new loss in its paper's aggregation (docs/algorithms.md §1, §22.3).

The whole mini-batch in one micro-batch (1×8) must give the same loss and gradient as any split into
micro-batches (8×1, 2×4, one packed row at a time), including the sequence-ratio losses, whose
per-sequence sums are taken inside each micro-batch, and CHORD, whose two parts have their own
denominators. KL and entropy terms ride along.
"""

import pytest
import torch

from trivium.algorithm import PolicyLossInputs, actor_loss, loss_scale

MAX_RESPONSE = 8.0
RESPONSES = [3, 7, [True, False, True, True], 1, 5, [False, False], 2, 6]
SEQ_ADVANTAGES = [1.2, -0.4, 0.3, -1.1, 0.0, 0.7, -0.2, 0.9]
EXPERT_SEQS = [1, 6]

CASES = {
    "gspo": ("gspo", {"clip_low": 0.02, "clip_high": 0.03}, "seq-mean-token-mean"),
    "topr": ("topr", {}, "seq-mean-token-sum"),
    "topr_token": ("topr_token", {"threshold": 0.1}, "token-mean"),
    "ppo_seq": ("ppo_seq", {}, "seq-mean-token-mean"),
    "rec-one-side-is": ("rec", {"clip_mode": "one-side", "weight": "is"}, "token-mean"),
    "rec-ring-asymre": (
        "rec",
        {"clip_mode": "ring", "regulariser": "forward-kl", "reg_coef": 0.1},
        "token-mean",
    ),
    "rec-gspo": (
        "rec",
        {"clip_mode": "gspo-one-side", "weight": "gspo-is", "clip_low": 0.02, "clip_high": 0.03},
        "seq-mean-token-mean",
    ),
    "cispo": ("cispo", {}, "token-mean"),
    "sapo": ("sapo", {}, "seq-mean-token-mean"),
    "sppo": ("sppo", {}, "token-mean"),
    "is_pg": ("is_pg", {}, "token-mean"),
    "chord-mu": ("chord", {}, "chord"),
    "chord-phi": ("chord", {"mu": 0.1, "phi": True}, "chord"),
    "dr-grpo-norm": ("ppo_clip", {}, "seq-mean-token-sum-norm"),
}
SPLITS = {
    "padded-8x1": (None, [[i] for i in range(8)]),
    "padded-2x4": (None, [[0, 5, 2, 7], [4, 1, 6, 3]]),
    "packed-by-row": (12, "rows"),
}


def setup(make_batch, pack_length):
    batch = make_batch(RESPONSES, pack_length=pack_length)
    gen = torch.Generator().manual_seed(7)
    shape = batch.loss_mask.shape
    logprobs = (-torch.rand(shape, generator=gen) * 3).requires_grad_(True)
    entropy = (torch.rand(shape, generator=gen) * 2).requires_grad_(True)
    old = logprobs.detach() + 0.2 * torch.randn(shape, generator=gen)
    ref = logprobs.detach() + 0.3 * torch.randn(shape, generator=gen)
    per_seq = torch.tensor(SEQ_ADVANTAGES)
    advantages = torch.where(batch.loss_mask, per_seq[batch.seq_index.clamp(min=0)], 0.0)
    is_expert = torch.isin(batch.seq_index, torch.tensor(EXPERT_SEQS))
    return batch, (logprobs, old, ref, advantages, is_expert, entropy)


def loss_over(case, batch, tensors, rows, scale):
    name, args, mode = CASES[case]
    sub = batch.select_rows(rows)
    rows = torch.as_tensor(rows)
    logprobs, old, ref, advantages, is_expert, entropy = (t[rows] for t in tensors)
    inputs = PolicyLossInputs(
        logprobs,
        old,
        advantages,
        sub.loss_mask,
        sub.seq_index,
        is_expert=is_expert if name == "chord" else None,
        step=30,
    )
    loss, _ = actor_loss(
        inputs,
        policy_loss=name,
        policy_loss_args=args,
        aggregation=mode,
        scale=scale,
        kl_estimator="k3",
        kl_coef=0.05,
        ref_logprobs=ref,
        entropy=entropy,
        entropy_coef=0.01,
    )
    return loss


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_micro_batch_equals_any_split(make_batch, case, split):
    pack_length, chunks = SPLITS[split]
    batch, tensors = setup(make_batch, pack_length)
    if chunks == "rows":
        assert batch.num_rows < 8  # several sequences share a row
        chunks = [[r] for r in range(batch.num_rows)]
    is_expert = tensors[4] if CASES[case][0] == "chord" else None
    scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE, is_expert=is_expert)
    logprobs, entropy = tensors[0], tensors[5]
    whole = loss_over(case, batch, tensors, list(range(batch.num_rows)), scale)
    whole_grads = torch.autograd.grad(whole, (logprobs, entropy))
    accumulated = sum(loss_over(case, batch, tensors, rows, scale) for rows in chunks)
    accumulated_grads = torch.autograd.grad(accumulated, (logprobs, entropy))
    torch.testing.assert_close(accumulated, whole, rtol=1e-6, atol=1e-7)
    for got, expected in zip(accumulated_grads, whole_grads):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-8)
    assert whole_grads[0].abs().sum() > 0
    assert (whole_grads[0][~batch.loss_mask] == 0).all()  # prompt, padding and tool tokens get nothing


@pytest.mark.parametrize("case", ["gspo", "topr", "ppo_seq", "rec-gspo", "chord-mu"])
def test_padded_and_packed_layouts_agree(make_batch, case):
    losses = []
    for pack_length in (None, 12):
        batch, tensors = setup(make_batch, pack_length)
        # Same per-token values in both layouts: functions of (sequence id, position in the sequence).
        key = (batch.seq_index * 10 + batch.position_ids).float()
        logprobs = -0.02 * key - 0.1
        old = logprobs + 0.01 * torch.sin(key)
        ref = logprobs + 0.02 * torch.cos(key)
        entropy = 0.1 * key
        advantages, is_expert = tensors[3], tensors[4]
        values = (logprobs, old, ref, advantages, is_expert, entropy)
        scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE, is_expert=is_expert)
        losses.append(loss_over(case, batch, values, list(range(batch.num_rows)), scale))
    torch.testing.assert_close(losses[0], losses[1])
