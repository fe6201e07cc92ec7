import math

import pytest
import torch

from trivium.algorithm.rewards_shaping import (
    AdaptiveKLController,
    FixedKLController,
    kl_controller,
    kl_penalty_token_rewards,
    outcome_token_rewards,
    overlong_penalty,
    zero_variance_groups,
)

LAYOUTS = pytest.mark.parametrize("pack_length", [None, 64], ids=["padded", "packed"])


# ---- token rewards (docs/algorithms.md §2.1a) ----


@LAYOUTS
def test_outcome_reward_sits_on_the_last_action_token(make_batch, place_values, pack_length):
    # Sequence 0 ends with a tool token: its reward goes on its last *action* token (the second).
    # Sequence 3 has no action token: its reward has nowhere to go and is dropped.
    batch = make_batch([[True, True, False], 1, [False, True, True], [False]], pack_length=pack_length)
    rewards = torch.tensor([1.0, -2.0, 0.5, 9.0])
    rw = outcome_token_rewards(rewards, batch.loss_mask, batch.seq_index)
    expected = place_values(batch, [[0.0, 1.0], [-2.0], [0.0, 0.5], []])
    torch.testing.assert_close(rw, expected)


@LAYOUTS
def test_kl_penalty_on_every_action_token_and_reward_on_the_last(make_batch, place_values, pack_length):
    batch = make_batch([[True, False, True, True], 2], pack_length=pack_length)
    nan = float("nan")  # log-probs off the mask are junk and must not leak
    old = place_values(batch, [[-1.0, -2.0, -0.5], [-1.5, -0.2]], fill=nan)
    ref = place_values(batch, [[-1.5, -1.0, -0.5], [-1.0, -0.7]], fill=nan)
    rw, metrics = kl_penalty_token_rewards(
        torch.tensor([1.0, 0.0]), batch.loss_mask, batch.seq_index, old, ref, kl_coef=0.1
    )
    # k1 = ℓold − ℓref: [0.5, −1.0, 0.0] and [−0.5, 0.5]; rw = −0.1·k1 (+ R on the last token).
    expected = place_values(batch, [[-0.05, 0.1, 1.0], [0.05, -0.05]])
    torch.testing.assert_close(rw, expected)
    # KL_obs = mean over responses of their token-mean KL = ((−0.5/3) + 0)/2.
    assert metrics["kl_penalty/kl_mean"] == pytest.approx((-0.5 / 3 + 0.0) / 2)
    assert metrics["kl_penalty/penalty"] == pytest.approx((0.05 + 0.0) / 2)
    assert metrics["kl_penalty/coef"] == 0.1


def test_kl_penalty_uses_the_named_estimator(make_batch, place_values):
    batch = make_batch([1])
    old, ref = place_values(batch, [[-1.0]]), place_values(batch, [[-1.5]])  # δ = 0.5
    args = (torch.tensor([0.0]), batch.loss_mask, batch.seq_index, old, ref)
    rw, _ = kl_penalty_token_rewards(*args, kl_coef=1.0, estimator="k3")
    assert rw[batch.loss_mask].item() == pytest.approx(-(math.exp(-0.5) - 0.5))  # −k3 = −0.1065307
    rw, _ = kl_penalty_token_rewards(*args, kl_coef=1.0, estimator="k2")
    assert rw[batch.loss_mask].item() == pytest.approx(-0.125)


def test_kl_coef_zero_gives_outcome_rewards_and_everything_is_detached(make_batch):
    batch = make_batch([3, 2])
    rewards = torch.tensor([1.0, 0.5], requires_grad=True)
    old = torch.randn(batch.loss_mask.shape, requires_grad=True)
    rw, _ = kl_penalty_token_rewards(rewards, batch.loss_mask, batch.seq_index, old, old * 2, kl_coef=0.0)
    torch.testing.assert_close(rw, outcome_token_rewards(rewards, batch.loss_mask, batch.seq_index))
    assert not rw.requires_grad


def test_kl_penalty_errors_name_the_problem(make_batch):
    batch = make_batch([2])
    good = torch.zeros(batch.loss_mask.shape)
    args = (torch.tensor([1.0]), batch.loss_mask, batch.seq_index)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        kl_penalty_token_rewards(*args, good, good, kl_coef=-0.1)
    with pytest.raises(ValueError, match="ref_logprobs must have the mask's"):
        kl_penalty_token_rewards(*args, good, good[:, :1], kl_coef=0.1)


# ---- β controllers (Ziegler et al.) ----


@pytest.mark.parametrize(
    ("observed", "error"),
    [(0.15, 0.2), (0.11, 0.1), (0.1, 0.0), (0.09, -0.1), (0.0, -0.2)],  # e = clip(KL/0.1 − 1, ±0.2)
)
def test_adaptive_kl_update(observed, error):
    ctl = AdaptiveKLController(0.05, target=0.1, horizon=10000)
    new = ctl.update(observed, n_steps=256)
    assert new == ctl.value == pytest.approx(0.05 * (1 + error * 256 / 10000))


def test_adaptive_kl_compounds_and_round_trips_its_state():
    ctl = AdaptiveKLController(0.2, target=0.1, horizon=1000)
    for _ in range(3):
        ctl.update(1.0, n_steps=100)  # error capped at +0.2: β · 1.02 per step
    assert ctl.value == pytest.approx(0.2 * 1.02**3)
    fresh = AdaptiveKLController(0.2, target=0.1, horizon=1000)
    fresh.load_state_dict(ctl.state_dict())
    assert fresh == ctl


def test_fixed_kl_controller_and_factory():
    ctl = kl_controller(0.01, adaptive=False, target=0.1, horizon=10)
    assert isinstance(ctl, FixedKLController)
    assert ctl.update(5.0, 1000) == 0.01 == ctl.value
    ctl.load_state_dict({"value": 0.3})
    assert ctl.state_dict() == {"value": 0.3}
    assert isinstance(kl_controller(0.01, adaptive=True, target=0.1, horizon=10), AdaptiveKLController)


def test_kl_controller_errors():
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(0.1, target=0.0)
    with pytest.raises(ValueError, match=r"β must be >= 0"):
        FixedKLController(-1.0)
    with pytest.raises(ValueError, match="finite observed_kl"):
        AdaptiveKLController(0.1).update(float("nan"), 8)


# ---- DAPO (docs/algorithms.md §6) ----


def test_overlong_penalty_worked_examples():
    lengths = torch.tensor([0, 16384, 16385, 18432, 20480, 20481])
    penalty = overlong_penalty(lengths, max_length=20480, cache_length=4096)
    expected = [0.0, 0.0, -1 / 4096, -0.5, -1.0, -1.0]  # ramp ((L_max − L_cache) − |y|) / L_cache
    assert penalty.dtype == torch.float32
    assert penalty.tolist() == pytest.approx(expected)
    half = overlong_penalty(lengths, max_length=20480, cache_length=4096, factor=0.5)
    assert half.tolist() == pytest.approx([0.5 * e for e in expected])


@pytest.mark.parametrize("cache_length", [0, 20481])
def test_overlong_penalty_rejects_a_bad_cache_length(cache_length):
    with pytest.raises(ValueError, match=f"cache_length={cache_length}, max_length=20480"):
        overlong_penalty(torch.tensor([1]), max_length=20480, cache_length=cache_length)


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 1.0, 0.0, 0.5])
    group_ids = torch.tensor([7, 3, 7, 3, 9, 7, 3, 5])  # 7: all 1 · 3: mixed · 9, 5: one sample each
    assert zero_variance_groups(rewards, group_ids).tolist() == [
        True,
        False,
        True,
        False,
        True,
        True,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="zero_variance_groups needs every group id >= 0"):
        zero_variance_groups(rewards[:2], torch.tensor([-1, -1]))


def test_kl_penalty_needs_both_logprobs(make_batch):
    batch = make_batch([2])
    good = torch.zeros(batch.loss_mask.shape)
    with pytest.raises(ValueError, match=r"needs ref_logprobs.*use outcome_token_rewards"):
        kl_penalty_token_rewards(
            torch.tensor([1.0]), batch.loss_mask, batch.seq_index, good, None, kl_coef=0.1
        )
