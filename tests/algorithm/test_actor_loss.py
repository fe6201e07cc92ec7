import pytest
import torch

from trivium.algorithm import (
    ADVANTAGE_FNS,
    AGGREGATIONS,
    AdvantageInputs,
    PolicyLossInputs,
    actor_loss,
    aggregate,
    loss_scale,
)

MAX_RESPONSE = 8.0  # C of seq-mean-token-sum-norm: the configured max length, not a batch's padded length
# Eight sequences of different lengths (one with a tool token, one with no action token), two groups of 4.
RESPONSES = [3, 7, [True, False, True, True], 1, 5, [False, False], 2, 6]
REWARDS = [1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]


def setup(make_batch, pack_length):
    batch = make_batch(RESPONSES, rewards=REWARDS, group_ids=GROUPS, pack_length=pack_length)
    gen = torch.Generator().manual_seed(3)
    shape = batch.loss_mask.shape
    logprobs = (-torch.rand(shape, generator=gen) * 3).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(shape, generator=gen)  # some ratios leave the clip band
    ref = logprobs.detach() + 0.5 * torch.randn(shape, generator=gen)
    advantages, _ = ADVANTAGE_FNS.get("grpo")(AdvantageInputs.from_batch(batch))  # once, on the whole batch
    return batch, logprobs, old, ref, advantages


def loss_over(batch, rows, logprobs, old, ref, advantages, mode, scale):
    sub = batch.select_rows(rows)  # renumbers sequences 0..N'-1 like the trainer's micro-batches
    rows = torch.as_tensor(rows)
    inputs = PolicyLossInputs(logprobs[rows], old[rows], advantages[rows], sub.loss_mask, sub.seq_index)
    return actor_loss(
        inputs,
        policy_loss="ppo_clip",
        policy_loss_args={"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0},
        aggregation=mode,
        scale=scale,
        kl_estimator="k3",
        kl_coef=0.1,
        ref_logprobs=ref[rows],
    )


SPLITS = {
    "padded-1x8": (None, [[0, 1, 2, 3, 4, 5, 6, 7]]),
    "padded-8x1": (None, [[i] for i in range(8)]),
    "padded-2x4": (None, [[0, 5, 2, 7], [4, 1, 6, 3]]),
    "packed-by-row": (12, "rows"),
}


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
@pytest.mark.parametrize("split", ["padded-8x1", "padded-2x4", "packed-by-row"])
def test_gradient_accumulation_is_invariant_to_the_split(make_batch, mode, split):
    pack_length, chunks = SPLITS[split]
    batch, logprobs, old, ref, advantages = setup(make_batch, pack_length)
    if chunks == "rows":
        assert batch.num_rows < 8  # several sequences share a row
        chunks = [[r] for r in range(batch.num_rows)]
    scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE)  # global, before splitting
    whole, _ = loss_over(batch, list(range(batch.num_rows)), logprobs, old, ref, advantages, mode, scale)
    (whole_grad,) = torch.autograd.grad(whole, logprobs)

    accumulated = sum(
        loss_over(batch, rows, logprobs, old, ref, advantages, mode, scale)[0] for rows in chunks
    )
    (accumulated_grad,) = torch.autograd.grad(accumulated, logprobs)

    torch.testing.assert_close(accumulated, whole, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(accumulated_grad, whole_grad, rtol=1e-6, atol=1e-8)
    assert whole_grad.abs().sum() > 0


def test_padded_and_packed_layouts_give_the_same_loss(make_batch):
    losses = []
    for pack_length in (None, 12):
        batch, _, old, ref, advantages = setup(make_batch, pack_length)
        # Same per-token values whatever the layout: a function of (sequence id, position in sequence).
        values = batch.seq_index * 10.0 + batch.position_ids
        old, ref = values.detach() * -0.01, values.detach() * -0.02
        scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE)
        rows = list(range(batch.num_rows))
        losses.append(
            loss_over(batch, rows, values * -0.011, old, ref, advantages, "seq-mean-token-mean", scale)[0]
        )
    torch.testing.assert_close(losses[0], losses[1])


def test_per_micro_batch_denominators_would_break_invariance(make_batch):
    # The test above has teeth: token-mean with each micro-batch's own token count is a different loss.
    batch, logprobs, old, ref, advantages = setup(make_batch, None)
    whole_scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE)
    whole, _ = loss_over(batch, list(range(8)), logprobs, old, ref, advantages, "token-mean", whole_scale)
    naive = 0.0
    for r in range(8):
        sub = batch.select_rows([r])
        local = loss_scale(sub.loss_mask, sub.seq_index, MAX_RESPONSE)
        naive = naive + loss_over(batch, [r], logprobs, old, ref, advantages, "token-mean", local)[0] / 8
    assert abs(float(naive.detach()) - float(whole.detach())) > 1e-3


def test_loss_is_policy_plus_coef_times_kl_and_reports_both(make_batch):
    batch, logprobs, old, ref, advantages = setup(make_batch, None)
    scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE)
    inputs = PolicyLossInputs(logprobs, old, advantages, batch.loss_mask, batch.seq_index)
    common = {"policy_loss": "sft", "policy_loss_args": {}, "aggregation": "token-mean", "scale": scale}
    loss, metrics = actor_loss(inputs, **common, kl_estimator="k2", kl_coef=0.5, ref_logprobs=ref)
    nll = aggregate(-logprobs, batch.loss_mask, batch.seq_index, "token-mean", scale).detach()
    kl = aggregate(
        0.5 * (logprobs - ref) ** 2, batch.loss_mask, batch.seq_index, "token-mean", scale
    ).detach()
    torch.testing.assert_close(loss.detach(), nll + 0.5 * kl)
    assert metrics["loss/policy"] == pytest.approx(float(nll))
    assert metrics["loss/kl"] == pytest.approx(float(kl))
    assert metrics["kl/mean"] == pytest.approx(float(kl))  # token-mean over the whole batch = masked mean
    assert metrics["loss/actor"] == pytest.approx(float(loss.detach()))
    assert "sft/nll" in metrics


def test_kl_is_measured_but_not_added_when_coef_is_zero(make_batch):
    batch, logprobs, old, ref, advantages = setup(make_batch, None)
    scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE)
    inputs = PolicyLossInputs(logprobs, old, advantages, batch.loss_mask, batch.seq_index)
    common = {"policy_loss": "ppo_clip", "policy_loss_args": {}, "aggregation": "token-mean", "scale": scale}
    without, m0 = actor_loss(inputs, **common)
    measured, m1 = actor_loss(inputs, **common, kl_estimator="k3", ref_logprobs=ref)
    assert float(without.detach()) == float(measured.detach())
    assert "kl/mean" in m1 and "loss/kl" not in m1 and "kl/mean" not in m0


def test_configuration_errors_are_clear(make_batch):
    batch, logprobs, old, ref, advantages = setup(make_batch, None)
    scale = loss_scale(batch.loss_mask, batch.seq_index, MAX_RESPONSE)
    inputs = PolicyLossInputs(logprobs, old, advantages, batch.loss_mask, batch.seq_index)
    common = {"policy_loss": "ppo_clip", "aggregation": "token-mean", "scale": scale}
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        actor_loss(inputs, **common, policy_loss_args={}, kl_estimator="k3", kl_coef=0.1)
    with pytest.raises(ValueError, match="needs kl_estimator, one of: abs, k1"):
        actor_loss(inputs, **common, policy_loss_args={}, kl_coef=0.1, ref_logprobs=ref)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        actor_loss(inputs, **common, policy_loss_args={}, kl_coef=-1.0)
    with pytest.raises(TypeError, match=r"unknown args \['clip_ratio'\]; valid args: clip_high, clip_low"):
        actor_loss(inputs, **common, policy_loss_args={"clip_ratio": 0.2})
