"""REC family (docs/algorithms.md §15): clip masks, weights, regularisers, and GRPO as a member."""

import math

import pytest
import torch

from trivium.algorithm import POLICY_LOSS_FNS, PolicyLossInputs
from trivium.algorithm.losses_rec import rec_clip_mask


def inputs_for(advantages, ratios, seq_index=None, logprobs=None):
    advantages = torch.as_tensor(advantages, dtype=torch.float64).reshape(1, -1)
    ratios = torch.as_tensor(ratios, dtype=torch.float64).reshape(1, -1)
    if logprobs is None:
        lp = torch.linspace(-0.5, -2.5, ratios.numel(), dtype=torch.float64).reshape(1, -1)
    else:
        lp = torch.as_tensor(logprobs, dtype=torch.float64).reshape(1, -1)
    lp.requires_grad_(True)
    seq = torch.zeros_like(ratios, dtype=torch.long) if seq_index is None else torch.tensor([seq_index])
    mask = torch.ones_like(ratios, dtype=torch.bool)
    return PolicyLossInputs(lp, lp.detach() - ratios.log(), advantages, mask, seq), lp


def rec_grad(advantages, ratios, **args):
    inputs, lp = inputs_for(advantages, ratios)
    loss, metrics = POLICY_LOSS_FNS.get("rec")(inputs, **args)
    loss.sum().backward()
    return loss[0].tolist(), lp.grad[0].tolist(), metrics


# ε = 0.2, ε' = 0.6 / 2.0: the §15 mask examples.
@pytest.mark.parametrize(
    ("advantage", "ratio", "expected"),
    [
        (-0.25, 3.5, {"one-side": 1, "two-side": 0, "ring": 1}),  # ring: ρ̄ ≥ 1 + 2.0
        (0.75, 0.3, {"one-side": 1, "two-side": 0, "ring": 1}),  # ring: ρ̄ ≤ 1 − 0.6
        (0.75, 1.3, {"one-side": 0, "two-side": 0, "ring": 0}),
        (0.75, 1.1, {"one-side": 1, "two-side": 1, "ring": 1}),
        (-0.25, 0.5, {"one-side": 0, "two-side": 0, "ring": 0}),  # 0.5 is between 0.4 and 0.8
    ],
)
def test_mask_examples(advantage, ratio, expected):
    for mode, keep in {**expected, "none": 1}.items():
        mask = rec_clip_mask(torch.tensor([ratio]), torch.tensor([advantage]), mode)
        assert int(mask) == keep, mode
        # and through the loss: W = 1, so the gradient is −M·A
        _, grad, _ = rec_grad([advantage], [ratio], clip_mode=mode)
        assert grad == pytest.approx([-keep * advantage])


def test_rec_one_side_is_has_the_ppo_clip_gradient():
    gen = torch.Generator().manual_seed(0)
    ratios = torch.exp(0.4 * torch.randn(64, generator=gen, dtype=torch.float64))
    advantages = torch.randn(64, generator=gen, dtype=torch.float64)
    advantages[:4] = 0.0
    grads = {}
    for name, args in [("rec", {"clip_mode": "one-side", "weight": "is"}), ("ppo_clip", {})]:
        inputs, lp = inputs_for(advantages, ratios)
        loss, _ = POLICY_LOSS_FNS.get(name)(inputs, **args)
        loss.sum().backward()
        grads[name] = lp.grad
    assert (grads["ppo_clip"] == 0).any() and (grads["ppo_clip"] != 0).any()
    torch.testing.assert_close(grads["rec"], grads["ppo_clip"])


def test_reinforce_member_ignores_the_ratio():
    loss, grad, metrics = rec_grad([1.0, -0.5], [5.0, 0.1], clip_mode="none")
    assert grad == pytest.approx([-1.0, 0.5])
    assert loss == pytest.approx([-1.0 * -0.5, 0.5 * -2.5])  # −A·ℓ, ℓ = [−0.5, −2.5]
    assert metrics["policy/clip_fraction"] == 0.0


def test_weights():
    _, grad, _ = rec_grad([1.0, -1.0], [1.1, 0.9], clip_mode="none", weight="is")
    assert grad == pytest.approx([-1.1, 0.9])  # −ρ̄·A, ρ̄ detached
    _, grad, metrics = rec_grad([1.0, -0.5], [1.0, 1.0], clip_mode="none", weight="advantage", tau=2.0)
    assert grad == pytest.approx([-math.exp(0.5), 0.5 * math.exp(-0.25)])  # RED-Weight: −exp(A/τ)·A
    assert metrics["rec/weight_mean"] == pytest.approx((math.exp(0.5) + math.exp(-0.25)) / 2)


def test_regularisers():
    # AsymRE: −c·ℓ adds −c to the gradient of every token; OPMD's k2: c·(ℓ − ℓold)² adds 2c·log ρ.
    _, grad, _ = rec_grad([1.0, -1.0], [1.0, 1.0], clip_mode="none", regulariser="forward-kl", reg_coef=0.1)
    assert grad == pytest.approx([-1.1, 0.9])
    _, grad, _ = rec_grad([0.0, 0.0], [math.e, 1.0], clip_mode="none", regulariser="k2", reg_coef=0.1)
    assert grad == pytest.approx([0.2, 0.0])
    # the regulariser is not masked by M: a clipped token keeps it
    _, grad, _ = rec_grad([1.0], [1.5], regulariser="forward-kl", reg_coef=0.1)
    assert grad == pytest.approx([-0.1])


def test_gspo_one_side_masks_whole_sequences_by_the_sequence_ratio():
    # Sequence 0: token ratios e^{±0.1} (each alone outside [1 − 3e-4, 1 + 4e-4]) but s_0 = 1: kept.
    # Sequence 1: s_1 = e^{0.01} > 1 + 4e-4 with A > 0: every token masked.
    ratios = [math.exp(0.1), math.exp(-0.1), math.exp(0.01), math.exp(0.01)]
    inputs, lp = inputs_for([1.0, 1.0, 1.0, 1.0], ratios, seq_index=[0, 0, 1, 1])
    args = {"clip_mode": "gspo-one-side", "clip_low": 3e-4, "clip_high": 4e-4, "weight": "gspo-is"}
    loss, _ = POLICY_LOSS_FNS.get("rec")(inputs, **args)
    loss.sum().backward()
    assert lp.grad[0].tolist() == pytest.approx([-1.0, -1.0, 0.0, 0.0])  # W = s_0 = 1
    # token-level one-side would have kept token 1 and masked token 0
    _, grad, _ = rec_grad([1.0, 1.0], ratios[:2], clip_low=3e-4, clip_high=4e-4)
    assert grad == pytest.approx([0.0, -1.0])


def test_bad_args_are_named():
    with pytest.raises(ValueError, match="clip_mode='onesided' is not one of: none, one-side"):
        rec_grad([1.0], [1.0], clip_mode="onesided")
    with pytest.raises(ValueError, match="weight='IS' is not one of"):
        rec_grad([1.0], [1.0], weight="IS")
    with pytest.raises(ValueError, match="has no effect: set both"):
        rec_grad([1.0], [1.0], regulariser="k2")
    with pytest.raises(ValueError, match="has no effect: set both"):
        rec_grad([1.0], [1.0], reg_coef=0.1)
    with pytest.raises(ValueError, match="ring bounds must lie outside the band"):
        rec_grad([1.0], [1.0], clip_mode="ring", ring_low=0.1)
    with pytest.raises(ValueError, match="tau must be > 0"):
        rec_grad([1.0], [1.0], weight="advantage", tau=0.0)
