"""M2PO's second-moment mask (stale samples) and GiGPO's anchor-state advantage, against hand-worked
numbers and the papers' own procedures written out the slow way."""

import math

import pytest
import torch

from trivium.algorithm.advantages import AdvantageInputs
from trivium.algorithm.policy_losses import PolicyLossInputs, second_moment_mask
from trivium.algorithm.presets import get_preset
from trivium.algorithm.registry import ADVANTAGE_FNS, POLICY_LOSS_FNS


def greedy_mask(log_ratio: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """The M2PO paper's loop: while the mean of (log r)² over the kept tokens exceeds τ, drop the largest."""
    keep = mask.clone()
    while keep.any() and float(log_ratio[keep].square().mean()) > tau:
        squares = torch.where(keep, log_ratio.square(), -1.0)
        keep.view(-1)[int(squares.view(-1).argmax())] = False
    return keep


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0, 3.0])
def test_the_second_moment_mask_equals_the_papers_loop(scale):
    gen = torch.Generator().manual_seed(int(scale * 100))
    for _ in range(20):
        log_ratio = torch.randn(6, 9, generator=gen) * scale
        mask = torch.rand(6, 9, generator=gen) > 0.3
        keep = second_moment_mask(log_ratio, mask, 0.04)
        assert torch.equal(keep, greedy_mask(log_ratio, mask, 0.04))
        assert not (keep & ~mask).any()
        if keep.any():
            assert float(log_ratio[keep].square().mean()) <= 0.04 + 1e-7


def stale_inputs(stale: torch.Tensor, logprobs: torch.Tensor | None = None):
    old = torch.full(stale.shape, -1.0)
    lp = (old if logprobs is None else logprobs).clone().requires_grad_(True)
    mask = torch.ones(stale.shape, dtype=torch.bool)
    mask[1, 3] = False
    return PolicyLossInputs(
        logprobs=lp,
        old_logprobs=old,
        advantages=torch.ones(stale.shape),
        mask=mask,
        seq_index=torch.arange(stale.shape[0]).unsqueeze(1).expand_as(mask),
        rollout_logprobs=old - stale,
    )


def test_m2po_on_fresh_samples_is_the_plain_is_gradient():
    inputs = stale_inputs(torch.zeros(2, 4))
    loss, metrics = POLICY_LOSS_FNS.get("m2po")(inputs)
    reference, _ = POLICY_LOSS_FNS.get("is_pg")(inputs)
    assert torch.equal(loss, reference)
    assert metrics["m2po/masked_fraction"] == 0.0 and metrics["m2po/m2_before"] == 0.0


def test_m2po_drops_the_stalest_tokens_only_and_weighs_the_rest_by_the_sampling_policy():
    # Seven tokens 0.1 off the sampling policy ((log r)² = 0.01 each), one 1.0 off: M2 = (7·0.01 + 1)/8 > 0.04.
    stale = torch.full((2, 4), 0.1)
    stale[0, 2] = 1.0
    # The current policy has moved far from the old one on token [1, 0]: PPO would clip it, M2PO does not.
    # The ratio is against the policy that sampled the tokens: ρ = π/π_rollout = e^(ℓ - ℓold + stale).
    lp = torch.full((2, 4), -1.0)
    lp[1, 0] = -0.2
    inputs = stale_inputs(stale, lp)
    loss, metrics = POLICY_LOSS_FNS.get("m2po")(inputs, m2_threshold=0.04)
    loss.sum().backward()
    grad = inputs.logprobs.grad
    assert grad[0, 2] == 0 and loss[0, 2] == 0  # the outlier is masked
    assert grad[1, 3] == 0  # off the mask
    kept = inputs.mask.clone()
    kept[0, 2] = False
    # Elsewhere the gradient of −A·ρ is −A·ρ: ρ = e^(0.8 + 0.1) on the moved token, unclipped, e^0.1 else.
    assert torch.allclose(grad[1, 0], torch.tensor(-math.exp(0.9)))
    assert torch.allclose(grad[kept & (lp == -1.0)], torch.tensor(-math.exp(0.1)))
    assert metrics["m2po/masked_fraction"] == pytest.approx(1 / 7)
    assert metrics["m2po/m2_after"] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="rollout engine's log-probs"):
        POLICY_LOSS_FNS.get("m2po")(PolicyLossInputs(**{**inputs.__dict__, "rollout_logprobs": None}))
    with pytest.raises(ValueError, match="m2_threshold > 0"):
        POLICY_LOSS_FNS.get("m2po")(inputs, m2_threshold=0.0)


def test_presets_name_the_new_parts():
    assert get_preset("m2po").policy_loss_fn == "m2po" and get_preset("m2po").advantage_fn == "grpo"
    assert get_preset("gigpo").advantage_fn == "gigpo"


def anchor_batch():
    """Group 0: three FrozenLake-like episodes from one start state A. Episode 0 reaches the goal via B;
    episode 1 falls in a hole via C; episode 2 passes B too but falls later (D). Group 1: two episodes of
    another task whose (only) turn starts from a state with the same id A, both successful."""
    # seq:        e0t0 e0t1 e1t0 e1t1 e2t0 e2t1 e2t2 | g1e0 g1e1
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 1])
    runs = torch.tensor([0, 0, 1, 1, 2, 2, 2, 0, 1])
    turns = torch.tensor([0, 1, 0, 1, 0, 1, 2, 0, 0])
    states = torch.tensor([0, 1, 0, 2, 0, 1, 3, 0, 0])  # A=0, B=1, C=2, D=3
    mask = torch.ones(9, 3, dtype=torch.bool)
    seq = torch.arange(9).unsqueeze(1).expand(9, 3)
    return AdvantageInputs(rewards, groups, mask, seq, run_ids=runs, turns=turns, states=states)


def test_gigpo_adds_the_step_advantage_among_turns_from_one_state():
    adv, metrics = ADVANTAGE_FNS.get("gigpo")(anchor_batch())
    # Episode level: returns [1, 0, 0], μ = 1/3, σ = sqrt(1/3): +1.1547 / -0.5774 on every turn.
    # Step level: state A holds the three first turns (the same numbers again); state B holds e0t1 (1)
    # and e2t1 (0): ±0.7071; C and D are reached once: 0. Group 1 is all successes: 0 at both levels, and
    # its state A is not group 0's.
    e, s = 2 / 3 / math.sqrt(1 / 3), 1 / math.sqrt(2)
    expected = [2 * e, e + s, -e, -e / 2, -e, -e / 2 - s, -e / 2, 0.0, 0.0]
    assert torch.allclose(adv[:, 0], torch.tensor(expected), atol=1e-5)
    assert (adv == adv[:, :1]).all()
    assert metrics["gigpo/anchor_groups"] == 3  # A and B in group 0, A in group 1
    assert metrics["gigpo/turns_in_anchor_groups"] == pytest.approx(7 / 9)
    # ω = 0 is step-wise GRPO with each turn given its episode's return.
    episode_only, _ = ADVANTAGE_FNS.get("gigpo")(anchor_batch(), step_weight=0.0)
    assert torch.allclose(
        episode_only[:, 0], torch.tensor([e, e, -e / 2, -e / 2, -e / 2, -e / 2, -e / 2, 0, 0])
    )
    centred, _ = ADVANTAGE_FNS.get("gigpo")(anchor_batch(), std_normalize=False)
    assert centred[0, 0] == pytest.approx(2 * 2 / 3) and centred[1, 0] == pytest.approx(2 / 3 + 0.5)


def test_gigpo_without_states_says_which_workflow_records_them():
    inputs = anchor_batch()
    with pytest.raises(ValueError, match="workflow: step_wise"):
        ADVANTAGE_FNS.get("gigpo")(AdvantageInputs(**{**inputs.__dict__, "states": None}))
    unknown = AdvantageInputs(**{**inputs.__dict__, "states": torch.full((9,), -1)})
    with pytest.raises(ValueError, match="workflow: step_wise"):
        ADVANTAGE_FNS.get("gigpo")(unknown)
