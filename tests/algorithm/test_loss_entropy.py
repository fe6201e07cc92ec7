"""Entropy bonus (docs/algorithms.md §2.2): the per-token entropy and its term in actor_loss."""

import math

import pytest
import torch

from trivium.algorithm import PolicyLossInputs, actor_loss, aggregate, loss_scale
from trivium.algorithm.losses_entropy import entropy_from_logits


def test_worked_example_and_temperature():
    p = torch.tensor([0.7, 0.2, 0.1])
    assert entropy_from_logits(p.log()).item() == pytest.approx(0.8018186, rel=1e-6)
    # Logits at temperature 2 describe the same distribution once divided by 2.
    assert entropy_from_logits(2 * p.log() + 5.0, temperature=2.0).item() == pytest.approx(
        0.8018186, rel=1e-6
    )
    with pytest.raises(ValueError, match="temperature > 0"):
        entropy_from_logits(p.log(), temperature=0.0)


def test_matches_minus_sum_p_log_p_in_value_and_gradient():
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11, generator=gen, dtype=torch.float64)).requires_grad_(True)
    h = entropy_from_logits(logits, temperature=0.7)
    assert h.shape == (2, 5)
    logp = torch.log_softmax(logits / 0.7, dim=-1)
    reference = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(h, reference.float())
    (grad,) = torch.autograd.grad(h.sum(), logits)
    (ref_grad,) = torch.autograd.grad(reference.sum(), logits)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)  # float32 inside


def test_extreme_and_banned_logits_stay_finite():
    logits = torch.tensor([[1e4, 0.0, -1e4], [0.0, 0.0, float("-inf")]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert h[0].item() == pytest.approx(0.0, abs=1e-6)
    assert h[1].item() == pytest.approx(math.log(2), rel=1e-6)  # the banned token counts as p = 0
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    bf16 = entropy_from_logits(torch.tensor([0.7, 0.2, 0.1]).log().bfloat16())
    assert bf16.dtype == torch.float32


def test_actor_loss_subtracts_the_aggregated_entropy(make_batch):
    batch = make_batch([3, [True, False, True], 2], pack_length=16)
    gen = torch.Generator().manual_seed(1)
    shape = batch.loss_mask.shape
    lp = (-torch.rand(shape, generator=gen)).requires_grad_(True)
    entropy = torch.rand(shape, generator=gen).requires_grad_(True)
    inputs = PolicyLossInputs(lp, lp.detach(), torch.ones(shape), batch.loss_mask, batch.seq_index)
    scale = loss_scale(batch.loss_mask, batch.seq_index, 8)
    common = {"policy_loss": "ppo_clip", "policy_loss_args": {}, "aggregation": "seq-mean-token-mean"}
    base, m0 = actor_loss(inputs, **common, scale=scale)
    measured, m1 = actor_loss(inputs, **common, scale=scale, entropy=entropy)
    total, m2 = actor_loss(inputs, **common, scale=scale, entropy=entropy, entropy_coef=0.01)
    h = aggregate(entropy, batch.loss_mask, batch.seq_index, "seq-mean-token-mean", scale)
    assert measured.item() == base.item() and "entropy/mean" not in m0 and "loss/entropy" not in m1
    torch.testing.assert_close(total, base - 0.01 * h)
    assert m1["entropy/mean"] == pytest.approx(float(entropy.detach()[batch.loss_mask].mean()))
    assert m2["loss/entropy"] == pytest.approx(h.item()) and m2["loss/actor"] == pytest.approx(total.item())
    (grad,) = torch.autograd.grad(total, entropy)  # H is differentiable; masked positions get nothing
    assert (grad[batch.loss_mask] < 0).all() and (grad[~batch.loss_mask] == 0).all()


def test_entropy_config_errors(make_batch):
    batch = make_batch([2])
    lp = torch.zeros(batch.loss_mask.shape)
    inputs = PolicyLossInputs(lp, lp, lp, batch.loss_mask, batch.seq_index)
    scale = loss_scale(batch.loss_mask, batch.seq_index, 8)
    common = {"policy_loss": "sft", "policy_loss_args": {}, "aggregation": "token-mean", "scale": scale}
    with pytest.raises(ValueError, match=r"entropy_coef=0\.01 needs entropy"):
        actor_loss(inputs, **common, entropy_coef=0.01)
    with pytest.raises(ValueError, match="entropy_coef must be >= 0"):
        actor_loss(inputs, **common, entropy=lp, entropy_coef=-0.01)
