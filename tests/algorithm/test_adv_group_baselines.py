import math

import pytest
import torch

from trivium.algorithm import ADVANTAGE_FNS, AdvantageInputs
from trivium.algorithm.advantages import grpo, rec
from trivium.algorithm.advantages_group import asymre, reinforceplusplus_baseline, rloo


def one_token_each(rewards, group_ids=None):
    """One action token per sequence, one sequence per row: advantages [N, 1] read back as [N]."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    n = rewards.numel()
    group_ids = torch.zeros(n, dtype=torch.long) if group_ids is None else torch.as_tensor(group_ids)
    return AdvantageInputs(rewards, group_ids, torch.ones(n, 1, dtype=torch.bool), torch.arange(n)[:, None])


def random_groups(seed, n=60, num_groups=9, min_size=1):
    gen = torch.Generator().manual_seed(seed)
    group_ids = torch.randint(0, num_groups, (n,), generator=gen)
    if min_size > 1:  # give every present group at least min_size members
        group_ids = torch.cat([group_ids, group_ids.unique().repeat_interleave(min_size - 1)])
    rewards = torch.randn(group_ids.numel(), generator=gen)
    rewards[group_ids == 4] = 1.0  # one all-equal group
    return rewards, group_ids


def members(group_ids):
    groups = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


# ---- RLOO (§7) ----


def test_rloo_worked_example():
    adv, _ = rloo(one_token_each([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def rloo_reference(rewards, group_ids):
    """A_i = R_i − mean of the other members, one group at a time (exactly 0 for an all-equal group)."""
    out = [0.0] * len(rewards)
    for idx in members(group_ids).values():
        values = [rewards[i] for i in idx]
        for i in idx:
            others = [rewards[j] for j in idx if j != i]
            out[i] = 0.0 if max(values) == min(values) else rewards[i] - sum(others) / len(others)
    return out


def test_rloo_vectorised_equals_looped_reference_and_the_closed_form():
    rewards, group_ids = random_groups(2, min_size=2)
    adv, metrics = rloo(one_token_each(rewards, group_ids))
    expected = rloo_reference(rewards.double().tolist(), group_ids.tolist())
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    # = G/(G−1) · (R − μ_g) = G/(G−1) × Dr. GRPO's advantage
    sizes = torch.bincount(group_ids)[group_ids].float()
    drgrpo, _ = grpo(one_token_each(rewards, group_ids), std_normalize=False)
    torch.testing.assert_close(adv[:, 0], sizes / (sizes - 1) * drgrpo[:, 0], rtol=1e-5, atol=1e-6)
    assert adv[group_ids == 4].abs().max() == 0
    assert metrics["advantage/num_groups"] == float(group_ids.unique().numel())


def test_rloo_refuses_groups_of_one_and_names_them():
    with pytest.raises(ValueError, match=r"rloo needs at least 2 samples per group.*group id\(s\) \[8\]"):
        rloo(one_token_each([1.0, 0.0, 0.5], group_ids=[3, 3, 8]))


@pytest.mark.parametrize("pack_length", [None, 64], ids=["padded", "packed"])
def test_rloo_whitening_is_over_sequences_with_action_tokens(make_batch, pack_length):
    # Sequence 2 has no action token: it counts in its group's baseline but not in the whitening.
    rewards = [1.0, 0.0, 0.0, 0.3, 0.9, 0.1]
    batch = make_batch(
        [2, [True, False, True], [False], 1, 4, 3],
        rewards=rewards,
        group_ids=[0, 0, 0, 1, 1, 1],
        pack_length=pack_length,
    )
    inputs = AdvantageInputs.from_batch(batch)
    raw = torch.tensor(rloo_reference(rewards, [0, 0, 0, 1, 1, 1]))
    kept = raw[[0, 1, 3, 4, 5]]
    expected = (raw - kept.mean()) / torch.sqrt(kept.var() + 1e-8)  # unbiased var, as everywhere
    adv, metrics = rloo(inputs, whiten=True)
    torch.testing.assert_close(adv, torch.where(batch.loss_mask, expected[batch.seq_index.clamp(min=0)], 0.0))
    assert metrics["advantage/mean"] == pytest.approx(float(raw.mean()), abs=1e-6)  # before whitening


# ---- AsymRE (§14) ----


def test_asymre_worked_example_and_conventions():
    adv, metrics = asymre(one_token_each([1.0, 0.0, 0.0, 0.0]))  # V = 0.25 − 0.1 = 0.15
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.85, -0.15, -0.15, -0.15]))
    assert metrics["advantage/baseline_mean"] == pytest.approx(0.15)
    adv, _ = asymre(one_token_each([0.7, 1.0, 1.0], group_ids=[5, 2, 2]))  # group of one: V = 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.7, 0.1, 0.1]))  # all-equal group: A = −δ_V
    adv, _ = asymre(one_token_each([1.0, 0.0]), baseline_shift=0.0)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5]))


def test_asymre_vectorised_equals_looped_reference():
    rewards, group_ids = random_groups(3)
    adv, _ = asymre(one_token_each(rewards, group_ids), baseline_shift=-0.3)
    expected = [0.0] * len(rewards)
    for idx in members(group_ids.tolist()).values():
        values = [float(rewards[i]) for i in idx]
        baseline = 0.0 if len(idx) == 1 else sum(values) / len(values) - 0.3
        for i in idx:
            expected[i] = float(rewards[i]) - baseline
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected), rtol=1e-5, atol=1e-6)


# ---- REC (§15) ----


def test_rec_is_the_group_mean_baseline_sharing_grpo_code():
    inputs = one_token_each([1.0, 0.0, 0.0, 0.0])
    adv, _ = rec(inputs)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    rewards, group_ids = random_groups(4)
    inputs = one_token_each(rewards, group_ids)
    for std_normalize in (False, True):
        torch.testing.assert_close(
            rec(inputs, std_normalize=std_normalize)[0], grpo(inputs, std_normalize=std_normalize)[0]
        )
    with pytest.raises(ValueError, match=r"rec needs every group id >= 0"):
        rec(one_token_each([1.0], group_ids=[-1]))


# ---- REINFORCE++-baseline (§8) ----


@pytest.mark.parametrize("pack_length", [None, 64], ids=["padded", "packed"])
def test_reinforceplusplus_baseline_worked_example(make_batch, place_values, pack_length):
    # R = [1, 0, 0, 0], lengths [2, 1, 1, 1]; the tool token in response 1 must not enter the statistics.
    batch = make_batch([[True, False, True], 1, 1, 1], rewards=[1.0, 0.0, 0.0, 0.0], pack_length=pack_length)
    adv, metrics = reinforceplusplus_baseline(AdvantageInputs.from_batch(batch))
    # token values [0.75, 0.75, −0.25 ×3]: mean 0.15, unbiased var 0.3
    pos, neg = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    torch.testing.assert_close(adv, place_values(batch, [[pos, pos], [neg], [neg], [neg]]))
    assert pos == pytest.approx(1.095445, abs=1e-6) and neg == pytest.approx(-0.730297, abs=1e-6)
    assert metrics["advantage/mean"] == pytest.approx(0.0)  # the group-relative Ã, before whitening


def test_reinforceplusplus_baseline_vectorised_equals_looped_reference(make_batch):
    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 6, (24,), generator=gen).tolist()
    rewards = torch.randint(0, 3, (24,), generator=gen).float().tolist()
    group_ids = torch.randint(0, 7, (24,), generator=gen).tolist()
    batch = make_batch(lengths, rewards=rewards, group_ids=group_ids, pack_length=16)
    adv, _ = reinforceplusplus_baseline(AdvantageInputs.from_batch(batch))
    seq_adv = [0.0] * 24
    for idx in members(group_ids).values():
        values = [rewards[i] for i in idx]
        mu = 0.0 if len(idx) == 1 else sum(values) / len(values)
        for i in idx:
            seq_adv[i] = rewards[i] - mu
    tokens = [seq_adv[i] for i in range(24) for _ in range(lengths[i])]
    mean = sum(tokens) / len(tokens)
    var = sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1)
    expected = torch.tensor([(a - mean) / math.sqrt(var + 1e-8) for a in seq_adv])
    torch.testing.assert_close(adv, torch.where(batch.loss_mask, expected[batch.seq_index.clamp(min=0)], 0.0))


def test_registered_names():
    for name, fn in [("rloo", rloo), ("asymre", asymre), ("rec", rec)]:
        assert ADVANTAGE_FNS.get(name) is fn
    assert ADVANTAGE_FNS.get("reinforceplusplus_baseline") is reinforceplusplus_baseline
