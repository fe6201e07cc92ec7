"""CHORD (docs/algorithms.md §16): μ schedule, φ, the per-part normalisation and its limits μ = 0 and μ = 1."""

import math

import pytest
import torch

from trivium.algorithm import (
    POLICY_LOSS_FNS,
    LossScale,
    PolicyLossInputs,
    actor_loss,
    aggregate,
    loss_scale,
)
from trivium.algorithm.losses_mix import chord_mu

REFERENCE = {"warmup_steps": 0, "decay_steps": 200, "mu_peak": 0.9, "mu_valley": 0.05}
RESPONSES = [3, 5, [True, False, True], 2, 4, 6]
EXPERT_SEQS = [1, 4]  # two expert demonstrations mixed into six sequences


@pytest.mark.parametrize(("step", "mu"), [(0, 0.9), (50, 0.7755204), (100, 0.475), (200, 0.05), (999, 0.05)])
def test_schedule_worked_numbers(step, mu):
    assert chord_mu(step, **REFERENCE) == pytest.approx(mu, rel=1e-6)


def test_schedule_warmup_and_errors():
    args = {**REFERENCE, "warmup_steps": 10}
    assert chord_mu(5, **args) == pytest.approx(0.45)  # linear warm-up to μ_peak
    assert chord_mu(10, **args) == pytest.approx(0.9)
    assert chord_mu(60, **args) == pytest.approx(0.7755204, rel=1e-6)  # the decay starts after warm-up
    with pytest.raises(ValueError, match="mu_peak, mu_valley in \\[0, 1\\]"):
        chord_mu(0, **{**REFERENCE, "mu_peak": 1.5})
    with pytest.raises(ValueError, match="step, warmup_steps, decay_steps >= 0"):
        chord_mu(-1, **REFERENCE)


def setup(make_batch, pack_length=None, seed=0):
    batch = make_batch(RESPONSES, pack_length=pack_length)
    gen = torch.Generator().manual_seed(seed)
    shape = batch.loss_mask.shape
    logprobs = (-torch.rand(shape, generator=gen) * 3).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(shape, generator=gen)
    per_seq = torch.randn(len(RESPONSES), generator=gen)
    advantages = torch.where(batch.loss_mask, per_seq[batch.seq_index.clamp(min=0)], 0.0)
    is_expert = torch.isin(batch.seq_index, torch.tensor(EXPERT_SEQS))
    return batch, logprobs, old, advantages, is_expert


def chord_loss(batch, logprobs, old, advantages, is_expert, step=0, **args):
    inputs = PolicyLossInputs(
        logprobs, old, advantages, batch.loss_mask, batch.seq_index, is_expert=is_expert, step=step
    )
    scale = loss_scale(batch.loss_mask, batch.seq_index, 8, is_expert=is_expert)
    return actor_loss(inputs, policy_loss="chord", policy_loss_args=args, aggregation="chord", scale=scale)


def part_loss(batch, logprobs, old, advantages, part_mask, name, **args):
    """``name`` with token-mean over ``part_mask`` alone: what each CHORD part must reduce to."""
    inputs = PolicyLossInputs(logprobs, old, advantages, part_mask, batch.seq_index)
    scale = loss_scale(part_mask, batch.seq_index, 8)
    return actor_loss(inputs, policy_loss=name, policy_loss_args=args, aggregation="token-mean", scale=scale)


@pytest.mark.parametrize("pack_length", [None, 16], ids=["padded", "packed"])
def test_mu_zero_is_exactly_ppo_on_rollouts_and_mu_one_exactly_sft_on_experts(make_batch, pack_length):
    batch, logprobs, old, advantages, is_expert = setup(make_batch, pack_length)
    rollout, expert = batch.loss_mask & ~is_expert, batch.loss_mask & is_expert
    for mu, reference in [
        (0.0, part_loss(batch, logprobs, old, advantages, rollout, "ppo_clip")[0]),
        (1.0, part_loss(batch, logprobs, old, advantages, expert, "sft")[0]),
    ]:
        loss, metrics = chord_loss(batch, logprobs, old, advantages, is_expert, mu=mu)
        assert loss.item() == reference.item()  # exactly, not approximately
        (grad,) = torch.autograd.grad(loss, logprobs)
        (ref_grad,) = torch.autograd.grad(reference, logprobs)
        assert torch.equal(grad, ref_grad)
        assert metrics["chord/mu"] == mu


def test_each_part_is_a_token_mean_over_its_own_subset(make_batch):
    batch, logprobs, old, advantages, is_expert = setup(make_batch)
    rollout, expert = batch.loss_mask & ~is_expert, batch.loss_mask & is_expert
    rl = part_loss(batch, logprobs, old, advantages, rollout, "ppo_clip")[0]
    sft = part_loss(batch, logprobs, old, advantages, expert, "sft")[0]
    loss, metrics = chord_loss(batch, logprobs, old, advantages, is_expert, mu=0.3)
    torch.testing.assert_close(loss, 0.7 * rl + 0.3 * sft)
    n_expert, n_all = int(expert.sum()), int(batch.loss_mask.sum())
    assert metrics["chord/expert_token_fraction"] == pytest.approx(n_expert / n_all)
    assert metrics["chord/sft_nll"] == pytest.approx(float(-logprobs.detach()[expert].mean()))
    # Plain token-mean would weigh the parts by their token shares instead: a different loss.
    inputs = PolicyLossInputs(
        logprobs, old, advantages, batch.loss_mask, batch.seq_index, is_expert=is_expert
    )
    scale = loss_scale(batch.loss_mask, batch.seq_index, 8, is_expert=is_expert)
    per_token, _ = POLICY_LOSS_FNS.get("chord")(inputs, mu=0.3)
    plain = aggregate(per_token, batch.loss_mask, batch.seq_index, "token-mean", scale)
    torch.testing.assert_close(plain, (0.7 * rl * (n_all - n_expert) + 0.3 * sft * n_expert) / n_all)
    assert abs(plain.item() - loss.item()) > 1e-3


def test_scheduled_mu_follows_the_step(make_batch):
    batch, logprobs, old, advantages, is_expert = setup(make_batch)
    _, metrics = chord_loss(batch, logprobs, old, advantages, is_expert, step=50)
    assert metrics["chord/mu"] == pytest.approx(0.7755204, rel=1e-6)
    _, metrics = chord_loss(batch, logprobs, old, advantages, is_expert, step=50, mu=0.1)
    assert metrics["chord/mu"] == 0.1


@pytest.mark.parametrize(("p", "phi"), [(0.9, 0.09), (0.5, 0.25), (0.01, 0.0099)])
def test_phi_weights_expert_tokens_by_p_times_one_minus_p(p, phi):
    lp = torch.tensor([[math.log(p), math.log(p)]], dtype=torch.float64, requires_grad=True)
    inputs = PolicyLossInputs(
        lp,
        lp.detach(),
        torch.zeros(1, 2, dtype=torch.float64),
        torch.tensor([[True, True]]),
        torch.zeros(1, 2, dtype=torch.long),
        is_expert=torch.tensor([[True, False]]),
    )
    loss, metrics = POLICY_LOSS_FNS.get("chord")(inputs, mu=1.0, phi=True)
    loss.sum().backward()
    assert loss[0, 0].item() == pytest.approx(-phi * math.log(p), rel=1e-6)
    assert lp.grad[0, 0].item() == pytest.approx(-phi, rel=1e-6)  # φ is detached: ∇ = −φ∇ℓ
    assert metrics["chord/phi_mean"] == pytest.approx(phi, rel=1e-6)


def test_chord_aggregation_weights_and_fallback(make_batch):
    batch = make_batch([2, 4])  # sequence 1 is expert: U has 2 tokens, E has 4
    is_expert = batch.seq_index == 1
    scale = loss_scale(batch.loss_mask, batch.seq_index, 8, is_expert=is_expert)
    assert scale == LossScale(num_tokens=6, num_seqs=2, norm_constant=8, num_expert_tokens=4)
    values = torch.where(batch.seq_index == 0, 1.0, 2.0)
    out = aggregate(values, batch.loss_mask, batch.seq_index, "chord", scale, is_expert)
    assert out.item() == pytest.approx(2 / 2 + 8 / 4)  # token-mean of U plus token-mean of E
    plain = loss_scale(batch.loss_mask, batch.seq_index, 8)  # no experts: chord == token-mean
    assert aggregate(values, batch.loss_mask, batch.seq_index, "chord", plain).item() == pytest.approx(10 / 6)


def test_inconsistent_expert_inputs_are_refused(make_batch):
    batch = make_batch([2, 4])
    is_expert = batch.seq_index == 1
    values = torch.ones(batch.loss_mask.shape)
    with_experts = loss_scale(batch.loss_mask, batch.seq_index, 8, is_expert=is_expert)
    without = loss_scale(batch.loss_mask, batch.seq_index, 8)
    with pytest.raises(ValueError, match="is_expert was not given"):
        aggregate(values, batch.loss_mask, batch.seq_index, "chord", with_experts)
    with pytest.raises(ValueError, match=r"build the scale with loss_scale\(.*is_expert"):
        aggregate(values, batch.loss_mask, batch.seq_index, "chord", without, is_expert)
    with pytest.raises(ValueError, match="is_expert must be a bool tensor"):
        loss_scale(batch.loss_mask, batch.seq_index, 8, is_expert=is_expert.float())
    with pytest.raises(ValueError, match="num_expert_tokens=7 must be in"):
        LossScale(num_tokens=6, num_seqs=2, norm_constant=8, num_expert_tokens=7)
    inputs = PolicyLossInputs(values, values, values, batch.loss_mask, batch.seq_index)
    with pytest.raises(ValueError, match=r"chord needs inputs\.is_expert"):
        POLICY_LOSS_FNS.get("chord")(inputs)
    with pytest.raises(ValueError, match=r"mu must be in \[0, 1\]"):
        POLICY_LOSS_FNS.get("chord")(
            PolicyLossInputs(values, values, values, batch.loss_mask, batch.seq_index, is_expert=is_expert),
            mu=2.0,
        )
