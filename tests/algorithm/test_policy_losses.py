import math

import pytest
import torch

from trivium.algorithm import POLICY_LOSS_FNS, PolicyLossInputs


def one_token(advantage: float, ratio: float, mask: bool = True):
    """ℓold = 0 and ℓ = log ρ, so dλ/dℓ = ρ · dλ/dρ; for the unclipped branch λ = −Aρ it is −Aρ."""
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    inputs = PolicyLossInputs(
        logprobs=logprobs,
        old_logprobs=torch.zeros(1, 1),
        advantages=torch.tensor([[advantage]]),
        mask=torch.tensor([[mask]]),
        seq_index=torch.zeros(1, 1, dtype=torch.long),
    )
    return inputs, logprobs


def loss_and_grad(advantage, ratio, **args):
    inputs, logprobs = one_token(advantage, ratio)
    loss, metrics = POLICY_LOSS_FNS.get("ppo_clip")(inputs, **args)
    loss.sum().backward()
    return loss.item(), logprobs.grad.item(), metrics


# docs/algorithms.md §3 examples (ε = 0.2, c = 3). Gradient: 0 when the clipped branch is active, else −Aρ.
@pytest.mark.parametrize(
    ("advantage", "ratio", "dual_clip", "loss", "grad"),
    [
        (1.0, 1.5, None, -1.2, 0.0),  # −A·(1 + 0.2), clipped
        (1.0, 1.1, None, -1.1, -1.1),  # −Aρ inside the band
        (-1.0, 0.5, None, 0.8, 0.0),  # −A·(1 − 0.2), clipped
        (-1.0, 4.0, None, 4.0, 4.0),  # −Aρ: clipping does not bound a negative-advantage loss from above
        (-1.0, 4.0, 3.0, 3.0, 0.0),  # dual-clip caps it at −c·A
        (-1.0, 2.0, 3.0, 2.0, 2.0),  # below the cap dual-clip changes nothing
        (1.0, 4.0, 3.0, -1.2, 0.0),  # dual-clip applies only when A < 0
    ],
)
def test_worked_examples(advantage, ratio, dual_clip, loss, grad):
    value, gradient, metrics = loss_and_grad(advantage, ratio, dual_clip=dual_clip)
    assert value == pytest.approx(loss, rel=1e-6)
    assert gradient == pytest.approx(grad, abs=1e-6)
    assert ("policy/dual_clip_fraction" in metrics) == (dual_clip is not None)


def test_dual_clip_fraction():
    _, _, metrics = loss_and_grad(-1.0, 4.0, dual_clip=3.0)
    assert metrics["policy/dual_clip_fraction"] == 1.0


@pytest.mark.parametrize(
    ("advantage", "ratio", "loss", "grad"),
    [
        (1.0, 1.25, -1.25, -1.25),  # inside [0.8, 1.28]: with the symmetric 0.2 it would be clipped
        (1.0, 1.3, -1.28, 0.0),  # above 1 + 0.28
        (-1.0, 0.75, 0.8, 0.0),  # the low bound stays 1 − 0.2
        (-1.0, 1.25, 1.25, 1.25),
    ],
)
def test_clip_higher_uses_decoupled_bounds(advantage, ratio, loss, grad):
    value, gradient, _ = loss_and_grad(advantage, ratio, clip_low=0.2, clip_high=0.28)
    assert value == pytest.approx(loss, rel=1e-6)
    assert gradient == pytest.approx(grad, abs=1e-6)
    symmetric, _, _ = loss_and_grad(1.0, 1.25)
    assert symmetric == pytest.approx(-1.2)


def test_on_policy_gradient_is_minus_advantage_not_zero():
    # ρ = 1 in value, but ∇ρ = ∇ℓ, so ∇λ = −A (the policy gradient). ρ replaced by 1 would give 0.
    logprobs = -torch.rand(3, 5) * 4
    leaf = logprobs.clone().requires_grad_(True)
    advantages = torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.3
    inputs = PolicyLossInputs(leaf, logprobs, advantages, mask, torch.arange(3)[:, None].expand(3, 5))
    loss, metrics = POLICY_LOSS_FNS.get("ppo_clip")(inputs)
    loss.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.where(mask, -advantages, 0.0))
    assert metrics["policy/clip_fraction"] == 0.0 and metrics["policy/ratio_mean"] == 1.0


def test_metrics_ignore_masked_tokens():
    # Valid tokens: ρ = 1 and ρ = 1.5 (A = +1, clipped). Masked tokens: ρ = 100 and e^−5, also "clipped".
    ratios = torch.tensor([[1.0, 1.5, 100.0, math.exp(-5)]])
    inputs = PolicyLossInputs(
        logprobs=ratios.log(),
        old_logprobs=torch.zeros(1, 4),
        advantages=torch.tensor([[1.0, 1.0, 1.0, -1.0]]),
        mask=torch.tensor([[True, True, False, False]]),
        seq_index=torch.zeros(1, 4, dtype=torch.long),
    )
    loss, metrics = POLICY_LOSS_FNS.get("ppo_clip")(inputs)
    assert metrics["policy/clip_fraction"] == pytest.approx(1 / 2)
    assert metrics["policy/ratio_mean"] == pytest.approx((1.0 + 1.5) / 2)
    assert metrics["policy/approx_kl"] == pytest.approx(-(0.0 + math.log(1.5)) / 2)  # mean of ℓold − ℓ
    assert loss[0, 2:].tolist() == [0.0, 0.0]


def test_bad_clip_args_are_refused():
    inputs, _ = one_token(1.0, 1.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        POLICY_LOSS_FNS.get("ppo_clip")(inputs, dual_clip=1.0)
    with pytest.raises(ValueError, match="clip_low, clip_high >= 0"):
        POLICY_LOSS_FNS.get("ppo_clip")(inputs, clip_low=-0.1)


def test_sft_is_masked_nll_and_ignores_advantages():
    logprobs = torch.tensor([[-0.5, -2.0, -9.0], [-1.0, -3.0, -7.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    inputs = PolicyLossInputs(
        logprobs, torch.full((2, 3), float("nan")), torch.full((2, 3), float("nan")), mask, torch.zeros(2, 3)
    )
    loss, metrics = POLICY_LOSS_FNS.get("sft")(inputs)
    assert loss.tolist() == [[0.5, 2.0, 0.0], [1.0, 0.0, 0.0]]
    assert metrics["sft/nll"] == pytest.approx((0.5 + 2.0 + 1.0) / 3)
    loss.sum().backward()
    assert logprobs.grad.tolist() == [[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]]


def test_inputs_must_share_one_shape():
    with pytest.raises(ValueError, match="one \\[R, L\\] shape"):
        PolicyLossInputs(
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            torch.zeros(2, 2),
            torch.ones(2, 3).bool(),
            torch.zeros(2, 3),
        )
