import dataclasses
import math

import pytest
import torch

from trivium.algorithm import ADVANTAGE_FNS, AdvantageInputs
from trivium.algorithm.advantages_critic import gae, gae_with_returns
from trivium.algorithm.advantages_returns import reinforceplusplus
from trivium.algorithm.rewards_shaping import kl_penalty_token_rewards, outcome_token_rewards

NAN = float("nan")
LAYOUTS = pytest.mark.parametrize("pack_length", [None, 64], ids=["padded", "packed"])


def with_tokens(batch, **per_token):
    return dataclasses.replace(AdvantageInputs.from_batch(batch), **per_token)


# ---- GAE (§3) ----


@LAYOUTS
@pytest.mark.parametrize(
    ("lam", "advantages", "returns"),
    [(1.0, [0.5, 0.4, 0.2], [1.0, 1.0, 1.0]), (0.95, [0.4705, 0.39, 0.2], [0.9705, 0.99, 1.0])],
)
def test_gae_worked_examples(make_batch, place_values, pack_length, lam, advantages, returns):
    # rw = [0, 0, 1], V = [0.5, 0.6, 0.8], γ = 1. A tool token sits inside the response and a second
    # response shares the batch: neither may change the numbers (the running values skip the hole).
    batch = make_batch([[True, False, True, True], 2], pack_length=pack_length)
    inputs = with_tokens(
        batch,
        token_rewards=place_values(batch, [[0.0, 0.0, 1.0], [0.3, -0.2]], fill=NAN),
        values=place_values(batch, [[0.5, 0.6, 0.8], [0.1, 0.9]], fill=NAN),
    )
    adv, ret, metrics = gae_with_returns(inputs, gamma=1.0, lam=lam, whiten=False)
    # second response: δ = [0.3 + 0.9 − 0.1, −0.2 − 0.9] = [1.1, −1.1]; Â = [1.1 − λ·1.1, −1.1]
    other = [1.1 - lam * 1.1, -1.1]
    torch.testing.assert_close(adv, place_values(batch, [advantages, other]))
    torch.testing.assert_close(ret, place_values(batch, [returns, [other[0] + 0.1, other[1] + 0.9]]))
    assert metrics["advantage/return_mean"] == pytest.approx(sum([*returns, other[0] + 0.1, -0.2]) / 5)


def test_gae_whitening_is_over_valid_tokens_and_returns_are_taken_before_it(make_batch, place_values):
    batch = make_batch([[True, False, True, True], 2])
    inputs = with_tokens(
        batch,
        token_rewards=place_values(batch, [[0.0, 0.0, 1.0], [0.3, -0.2]], fill=NAN),
        values=place_values(batch, [[0.5, 0.6, 0.8], [0.1, 0.9]], fill=NAN),
    )
    raw, ret_raw, _ = gae_with_returns(inputs, whiten=False)
    adv, ret, metrics = gae_with_returns(inputs)
    valid = raw[batch.loss_mask]  # [0.5, 0.4, 0.2, 0, −1.1]
    expected = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
    torch.testing.assert_close(adv[batch.loss_mask], expected)
    assert (adv[~batch.loss_mask] == 0).all()
    torch.testing.assert_close(ret, ret_raw)
    assert metrics["advantage/raw_mean"] == pytest.approx(float(valid.mean()))
    torch.testing.assert_close(ADVANTAGE_FNS.get("gae")(inputs)[0], adv)


def gae_reference(rw, values, mask, seq_index, gamma, lam):
    """§3 over the raw [R, L] layout, one sequence at a time, stepping back over every position and
    skipping masked ones (float64 Python)."""
    adv = torch.zeros(mask.shape, dtype=torch.float64)
    ret = torch.zeros(mask.shape, dtype=torch.float64)
    for i in seq_index.unique().tolist():
        if i < 0:
            continue
        rows, cols = (seq_index == i).nonzero(as_tuple=True)
        next_v, next_a = 0.0, 0.0
        for r, t in reversed(list(zip(rows.tolist(), cols.tolist()))):
            if not mask[r, t]:
                continue
            v = float(values[r, t])
            next_a = float(rw[r, t]) + gamma * next_v - v + gamma * lam * next_a
            adv[r, t], ret[r, t] = next_a, next_a + v
            next_v = v
    return adv, ret


def random_responses(seed, n=14, max_len=9):
    """Responses with random tool-token holes; one has no action token at all."""
    gen = torch.Generator().manual_seed(seed)
    responses = []
    for i in range(n):
        length = int(torch.randint(1, max_len + 1, (1,), generator=gen))
        action = (torch.rand(length, generator=gen) > 0.25).tolist()
        responses.append([False] if i == 3 else action)
    return responses, gen


def random_tokens(batch, gen):
    return torch.where(batch.loss_mask, torch.randn(batch.loss_mask.shape, generator=gen), NAN)


@pytest.mark.parametrize("pack_length", [None, 20], ids=["padded", "packed"])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 1.0), (0.0, 0.5)])
def test_gae_vectorised_equals_looped_reference(make_batch, pack_length, gamma, lam):
    responses, gen = random_responses(7)
    batch = make_batch(responses, pack_length=pack_length)
    rw, values = random_tokens(batch, gen), random_tokens(batch, gen)
    adv, ret, _ = gae_with_returns(
        with_tokens(batch, token_rewards=rw, values=values), gamma=gamma, lam=lam, whiten=False
    )
    exp_adv, exp_ret = gae_reference(rw, values, batch.loss_mask, batch.seq_index, gamma, lam)
    torch.testing.assert_close(adv, exp_adv.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, exp_ret.float(), rtol=1e-5, atol=1e-5)


def test_gae_needs_values_and_token_rewards(make_batch):
    batch = make_batch([2])
    zeros = torch.zeros(batch.loss_mask.shape)
    with pytest.raises(ValueError, match=r"gae needs inputs\.values: set algorithm_type ppo"):
        gae(with_tokens(batch, token_rewards=zeros))
    with pytest.raises(ValueError, match=r"gae needs inputs\.token_rewards: build them with"):
        gae(with_tokens(batch, values=zeros))
    with pytest.raises(ValueError, match=r"inputs.values must have the mask's \[R, L\] shape"):
        gae(with_tokens(batch, values=zeros[:, 1:], token_rewards=zeros))
    with pytest.raises(ValueError, match="0 <= lam <= 1"):
        gae(with_tokens(batch, values=zeros, token_rewards=zeros), lam=1.5)


def test_interleaved_sequences_are_refused():
    # Tokens of sequence 0 on both sides of sequence 1 within one row break the layout rule.
    mask = torch.ones(1, 3, dtype=torch.bool)
    inputs = AdvantageInputs(
        torch.zeros(2),
        torch.zeros(2, dtype=torch.long),
        mask,
        torch.tensor([[0, 1, 0]]),
        token_rewards=torch.zeros(1, 3),
        values=torch.zeros(1, 3),
    )
    with pytest.raises(ValueError, match=r"sequence\(s\) \[0\] are interleaved"):
        gae(inputs)


# ---- REINFORCE++ (§8) ----


@LAYOUTS
def test_reinforceplusplus_outcome_only(make_batch, place_values, pack_length):
    # γ = 1, no KL: Ret = R_i on every token of response i. R = [1, 0, 0, 0], lengths [2, 1, 1, 1]:
    # token values [1, 1, 0, 0, 0], mean 0.4, unbiased var 0.3.
    batch = make_batch([[True, False, True], 1, 1, 1], pack_length=pack_length)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    inputs = with_tokens(
        batch, token_rewards=outcome_token_rewards(rewards, batch.loss_mask, batch.seq_index)
    )
    adv, metrics = reinforceplusplus(inputs)
    pos, neg = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    torch.testing.assert_close(adv, place_values(batch, [[pos, pos], [neg], [neg], [neg]]))
    assert metrics["advantage/return_mean"] == pytest.approx(0.4)


def test_reinforceplusplus_with_kl_penalty_returns_to_go(make_batch, place_values):
    # rw = −β k1 on each token, + R on the last: Ret_t = R − β Σ_{s ≥ t} k_s (γ = 1).
    batch = make_batch([3, 2])
    old = place_values(batch, [[-1.0, -2.0, -0.5], [-1.5, -0.2]])
    ref = place_values(batch, [[-1.5, -1.0, -0.5], [-1.0, -0.7]])  # k1 = [0.5, −1, 0], [−0.5, 0.5]
    rw, _ = kl_penalty_token_rewards(
        torch.tensor([1.0, 0.0]), batch.loss_mask, batch.seq_index, old, ref, kl_coef=0.1
    )
    returns = torch.tensor([1.0 - 0.1 * (-0.5), 1.0 - 0.1 * (-1.0), 1.0, -0.1 * 0.0, -0.1 * 0.5])
    expected = (returns - returns.mean()) / torch.sqrt(returns.var() + 1e-8)
    adv, _ = reinforceplusplus(with_tokens(batch, token_rewards=rw))
    torch.testing.assert_close(adv[batch.loss_mask], expected)


@pytest.mark.parametrize("pack_length", [None, 20], ids=["padded", "packed"])
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_reinforceplusplus_vectorised_equals_looped_reference(make_batch, pack_length, gamma):
    responses, gen = random_responses(11)
    batch = make_batch(responses, pack_length=pack_length)
    rw = random_tokens(batch, gen)
    adv, _ = reinforceplusplus(with_tokens(batch, token_rewards=rw), gamma=gamma)
    # Returns are GAE with V = 0 and λ = 1; whitening over the valid tokens.
    ret, _ = gae_reference(rw, torch.zeros_like(rw), batch.loss_mask, batch.seq_index, gamma, 1.0)
    valid = ret[batch.loss_mask]
    expected = torch.zeros_like(ret)
    expected[batch.loss_mask] = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
    torch.testing.assert_close(adv, expected.float(), rtol=1e-5, atol=1e-5)


def test_reinforceplusplus_needs_token_rewards(make_batch):
    with pytest.raises(
        ValueError, match=r"reinforceplusplus needs inputs.token_rewards.*kl_penalty_token_rewards"
    ):
        reinforceplusplus(AdvantageInputs.from_batch(make_batch([2])))
