"""Token-level losses beyond PPO: IS-PG (§19), CISPO (§10), SAPO (§11), sPPO (§13)."""

import math

import pytest
import torch

from trivium.algorithm import POLICY_LOSS_FNS, PolicyLossInputs


def tokens(advantages, ratios, logprobs=None, mask=None):
    """One row; ℓold = ℓ − log ρ. dλ/dℓ is the coefficient on ∇ℓ that the spec's examples give."""
    ratios = torch.tensor([ratios], dtype=torch.float64)
    lp = torch.full_like(ratios, -1.0) if logprobs is None else torch.tensor([logprobs], dtype=torch.float64)
    lp.requires_grad_(True)
    mask = torch.ones_like(ratios, dtype=torch.bool) if mask is None else torch.tensor([mask])
    inputs = PolicyLossInputs(
        logprobs=lp,
        old_logprobs=lp.detach() - ratios.log(),
        advantages=torch.tensor([advantages], dtype=torch.float64).expand_as(ratios),
        mask=mask,
        seq_index=torch.zeros(ratios.shape, dtype=torch.long),
    )
    return inputs, lp


def loss_and_grad(name, advantages, ratios, **args):
    inputs, lp = tokens(advantages, ratios)
    loss, metrics = POLICY_LOSS_FNS.get(name)(inputs, **args)
    loss.sum().backward()
    return loss[0].tolist(), lp.grad[0].tolist(), metrics


# ---- IS-PG (§19) --------------------------------------------------------------------------------------


def test_is_pg_is_unclipped_minus_ratio_times_advantage():
    advantage = -1.2 - (-2.0)  # §19: ℓold = −2.0, ℓT = −1.2 ⇒ A = +0.8
    assert advantage == pytest.approx(0.8)
    loss, grad, metrics = loss_and_grad("is_pg", advantage, [1.0, 3.0, 0.1])
    assert loss == pytest.approx([-0.8, -2.4, -0.08])  # −ρA, no clip even at ρ = 3
    assert grad == pytest.approx([-0.8, -2.4, -0.08])  # ∇(−ρA) = −Aρ∇ℓ: on-policy −A∇ℓ, not 0
    assert metrics["policy/ratio_mean"] == pytest.approx((1.0 + 3.0 + 0.1) / 3)


# ---- CISPO (§10) --------------------------------------------------------------------------------------


def test_cispo_worked_example_and_stop_gradient():
    loss, grad, metrics = loss_and_grad("cispo", 2.0, [0.5, 1.0, 1.5, 3.0])  # bounds [0, 1.28]
    w = [0.5, 1.0, 1.28, 1.28]
    assert grad == pytest.approx([-1.0, -2.0, -2.56, -2.56])  # −A·w: the weight carries no gradient
    assert loss == pytest.approx([-wi * 2.0 * -1.0 for wi in w])  # the value holds ℓ = −1, not ρ
    assert metrics["policy/clip_fraction"] == 0.5
    _, ppo_grad, _ = loss_and_grad("ppo_clip", 2.0, [0.5, 1.0, 1.5, 3.0])
    assert ppo_grad[2:] == [0.0, 0.0]  # PPO drops those two tokens; CISPO keeps them


def test_cispo_lower_bound_and_trust_region_mask():
    _, grad, _ = loss_and_grad("cispo", 1.0, [0.5, 1.0], clip_low=0.2)
    assert grad == pytest.approx([-0.8, -1.0])  # weight floored at 1 − 0.2
    # Optional M: 0 where A > 0 and ρ > 1 + 0.28, or A < 0 and ρ < 1 − 0.2.
    loss, grad, metrics = loss_and_grad("cispo", 1.0, [1.0, 1.5], mask_clip_low=0.2, mask_clip_high=0.28)
    assert grad == pytest.approx([-1.0, 0.0]) and loss[1] == 0.0
    assert metrics["cispo/masked_fraction"] == 0.5
    _, grad, _ = loss_and_grad("cispo", -1.0, [0.5, 1.5], mask_clip_low=0.2, mask_clip_high=0.28)
    assert grad == pytest.approx([0.0, 1.28])
    with pytest.raises(ValueError, match="0 <= clip_low <= 1"):
        loss_and_grad("cispo", 1.0, [1.0], clip_low=1.5)


# ---- SAPO (§11) ---------------------------------------------------------------------------------------


def test_sapo_worked_examples():
    loss, grad, _ = loss_and_grad("sapo", 1.0, [1.2])  # τ_pos = 1
    assert loss == pytest.approx([-2.199336], rel=1e-6)
    sig = 1 / (1 + math.exp(-0.2))
    assert 4 * sig * (1 - sig) == pytest.approx(0.9900663, rel=1e-6)
    assert grad == pytest.approx([-1.188080], rel=1e-6)  # −A·4σ(1 − σ)·ρ: ρ is differentiable
    loss, _, _ = loss_and_grad("sapo", -1.0, [1.2])  # τ_neg = 1.05
    assert loss == pytest.approx([2.104030], rel=1e-6)
    loss, _, _ = loss_and_grad("sapo", 1.0, [1.0], tau_pos=2.0, tau_neg=2.0)
    assert loss == pytest.approx([-2.0 / 2.0])  # f(1; τ) = 2/τ


def test_sapo_gate_is_not_detached():
    # On-policy the gradient is the plain policy gradient −A∇ℓ; −sg[f]·A·ℓ would give −(2/τ)·A instead.
    inputs, lp = tokens([1.0, -1.0, 0.5], [1.0, 1.0, 1.0])
    inputs = PolicyLossInputs(
        lp, lp.detach(), torch.tensor([[1.0, -1.0, 0.5]], dtype=torch.float64), inputs.mask, inputs.seq_index
    )
    loss, metrics = POLICY_LOSS_FNS.get("sapo")(inputs)
    loss.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, 1.0, -0.5])
    assert metrics["sapo/gate_weight_mean"] == pytest.approx(1.0)


def test_sapo_damps_off_policy_tokens_smoothly_and_negatives_more():
    _, grad_pos, _ = loss_and_grad("sapo", 1.0, [0.5, 1.0, 2.0, 4.0])
    weights = [g / -(1.0 * r) for g, r in zip(grad_pos, [0.5, 1.0, 2.0, 4.0])]  # 4σ(1 − σ)
    assert weights[1] == pytest.approx(1.0) and weights[0] < 1 and weights[3] < weights[2] < 1
    assert all(w > 0 for w in weights)  # never exactly zero, unlike a hard clip
    _, grad_neg, _ = loss_and_grad("sapo", -1.0, [2.0])
    assert abs(grad_neg[0]) < abs(grad_pos[2])  # τ_neg = 1.05 > τ_pos decays faster
    with pytest.raises(ValueError, match="0 < tau_pos <= tau_neg"):
        loss_and_grad("sapo", 1.0, [1.0], tau_pos=1.1, tau_neg=1.0)


# ---- sPPO (§13) ---------------------------------------------------------------------------------------


def test_sppo_band_constants():
    assert pytest.approx(0.7692308, rel=1e-6) == 1 / 1.3
    assert math.log(1.3) == pytest.approx(0.2623643, rel=1e-6)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_sppo_gradient_is_masked_outside_the_band_whatever_the_sign(advantage):
    ratios = [0.75, 0.8, 1.0, 1.25, 1.35]
    loss, grad, metrics = loss_and_grad("sppo", advantage, ratios)
    assert grad == pytest.approx([0.0, -advantage, -advantage, -advantage, 0.0])
    bound = math.log(1.3)
    expected = [-advantage * min(max(math.log(r), -bound), bound) for r in ratios]
    assert loss == pytest.approx(expected)
    assert metrics["policy/clip_fraction"] == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="epsilon > 0"):
        loss_and_grad("sppo", advantage, ratios, epsilon=0.0)


@pytest.mark.parametrize("name", ["is_pg", "cispo", "sapo", "sppo"])
def test_masked_tokens_get_zero_loss_and_gradient(name):
    inputs, lp = tokens(1.0, [1.0, 50.0, 1e-4], logprobs=[-1.0, -9.0, -0.5], mask=[True, False, False])
    loss, _ = POLICY_LOSS_FNS.get(name)(inputs)
    loss.sum().backward()
    assert loss[0, 1:].tolist() == [0.0, 0.0] and lp.grad[0, 1:].tolist() == [0.0, 0.0]
