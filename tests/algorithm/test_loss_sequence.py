"""GSPO, TOPR and PPO's sequence form: docs/algorithms.md §9, §12, §7 worked numbers and looped references."""

import math

import pytest
import torch

from trivium.algorithm import POLICY_LOSS_FNS, PolicyLossInputs, aggregate, loss_scale

# Packed rows (several sequences per row), a tool token inside one response, one response with no
# action token at all: per-sequence sums must follow seq_index, not rows, and skip masked tokens.
RESPONSES = [3, [True, False, True, True], 5, [False, False], 2, 4]


def run(name, batch, logprobs, old, advantages, mode, **args):
    """Aggregated loss of the registered loss ``name`` over the whole batch, and its metrics."""
    inputs = PolicyLossInputs(logprobs, old, advantages, batch.loss_mask, batch.seq_index)
    per_token, metrics = POLICY_LOSS_FNS.get(name)(inputs, **args)
    assert (per_token[~batch.loss_mask] == 0).all()
    scale = loss_scale(batch.loss_mask, batch.seq_index, norm_constant=8)
    return aggregate(per_token, batch.loss_mask, batch.seq_index, mode, scale), metrics


def one_sequence(make_batch, place_values, log_ratios, advantage):
    """One response whose ℓ − ℓold are ``log_ratios`` (ℓold = 0), in a padded batch with a junk row."""
    batch = make_batch([len(log_ratios), [False]])
    logprobs = place_values(batch, [log_ratios, []], fill=7.0).requires_grad_(True)
    advantages = place_values(batch, [[advantage] * len(log_ratios), []])
    return batch, logprobs, torch.zeros_like(logprobs), advantages


def random_case(make_batch, seed, pack_length=12, noise=0.1):
    batch = make_batch(RESPONSES, pack_length=pack_length)
    assert pack_length is None or batch.num_rows < len(RESPONSES)
    gen = torch.Generator().manual_seed(seed)
    shape = batch.loss_mask.shape
    logprobs = (-torch.rand(shape, generator=gen) * 3).requires_grad_(True)
    old = logprobs.detach() + noise * torch.randn(shape, generator=gen)
    per_seq = torch.randn(len(RESPONSES), generator=gen)
    advantages = torch.where(batch.loss_mask, per_seq[batch.seq_index.clamp(min=0)], 0.0)
    return batch, logprobs, old, advantages, per_seq


def sequences(batch):
    """(sequence id, bool [R, L] selecting its valid tokens) for every sequence with n_i > 0."""
    for i in range(batch.num_seqs):
        where = (batch.seq_index == i) & batch.loss_mask
        if where.any():
            yield i, where


# ---- GSPO (§9) ----------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    log_ratios = torch.tensor([0.1, -0.1, 0.3])
    assert math.exp(log_ratios.mean()) == pytest.approx(1.105171, rel=1e-6)
    assert log_ratios.exp().tolist() == pytest.approx([1.105171, 0.904837, 1.349859], rel=1e-6)
    assert float(log_ratios.exp().prod()) == pytest.approx(1.349859, rel=1e-6)  # not the sequence ratio


@pytest.mark.parametrize(
    ("log_ratios", "advantage", "loss", "grad_per_token"),
    [
        ([0.1, -0.1, 0.3], 1.0, -1.0004, 0.0),  # s = 1.105171 clipped to 1 + 4e-4: no gradient
        ([0.1, -0.1, 0.3], -1.0, 1.105171, 1.105171 / 3),  # max(1.105171, 1.0004): ∇ = −A·s/n per token
        ([0.0002, -0.0001, 0.0005], 1.0, -1.0002000, -1.0002000 / 3),  # s inside the band
    ],
)
def test_gspo_worked_examples(make_batch, place_values, log_ratios, advantage, loss, grad_per_token):
    batch, logprobs, old, advantages = one_sequence(make_batch, place_values, log_ratios, advantage)
    value, metrics = run("gspo", batch, logprobs, old, advantages, "seq-mean-token-mean")
    assert value.item() == pytest.approx(loss, rel=1e-6)
    (grad,) = torch.autograd.grad(value, logprobs)
    assert grad[batch.loss_mask].tolist() == pytest.approx([grad_per_token] * 3, rel=1e-5, abs=1e-9)
    assert grad[~batch.loss_mask].abs().sum() == 0
    assert metrics["policy/clip_fraction"] == (1.0 if loss == -1.0004 else 0.0)


@pytest.mark.parametrize("pack_length", [None, 12], ids=["padded", "packed"])
def test_gspo_token_form_equals_the_sequence_form_in_value_and_gradient(make_batch, pack_length):
    batch, logprobs, old, advantages, per_seq = random_case(make_batch, 0, pack_length)
    args = {"clip_low": 0.01, "clip_high": 0.015}  # wide enough that only some sequences clip
    value, _ = run("gspo", batch, logprobs, old, advantages, "seq-mean-token-mean", **args)

    terms, clipped = [], 0
    for i, where in sequences(batch):  # (1/N) Σ_i −min(s_i A_i, clip(s_i) A_i), s_i differentiable
        s = torch.exp((logprobs[where] - old[where]).mean())
        a = per_seq[i]
        terms.append(torch.maximum(-a * s, -a * s.clamp(1 - 0.01, 1 + 0.015)))
        clipped += int(-a * s.clamp(1 - 0.01, 1 + 0.015) > -a * s)
    reference = torch.stack(terms).mean()
    assert 0 < clipped < len(terms)  # both branches are exercised
    torch.testing.assert_close(value, reference)
    torch.testing.assert_close(
        torch.autograd.grad(value, logprobs)[0], torch.autograd.grad(reference, logprobs)[0]
    )


def test_gspo_clipping_zeroes_the_whole_sequence(make_batch):
    batch, logprobs, old, advantages, _ = random_case(make_batch, 1, noise=0.3)
    value, _ = run("gspo", batch, logprobs, old, advantages, "seq-mean-token-mean")  # paper's 3e-4 / 4e-4
    (grad,) = torch.autograd.grad(value, logprobs)
    for _, where in sequences(batch):  # with noise 0.3 every s_i leaves the tiny band on one side or other
        assert (grad[where] == 0).all() or (grad[where] != 0).all()


# ---- TOPR (§12) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("log_ratios", "reward", "alpha"),
    [
        ([0.25, 0.25], -1.0, 1.0),  # ρ = e^0.5 = 1.648721 > 1: α = min(ρ, 1) = 1
        ([-0.25, -0.25], -1.0, 0.6065307),  # ρ = e^−0.5: tapered
        ([-1.5, -1.5], 1.0, 1.0),  # positive: α = 1 whatever ρ
    ],
)
def test_topr_worked_examples(make_batch, place_values, log_ratios, reward, alpha):
    assert math.exp(-0.5) == pytest.approx(0.6065307, rel=1e-6)
    batch, logprobs, old, advantages = one_sequence(make_batch, place_values, log_ratios, reward)
    old = old - 1.0  # ℓold = −1 − log ρ_t: Σℓ ≠ 0 so that the value shows −α R Σℓ
    logprobs = (logprobs.detach() - 1.0).requires_grad_(True)
    value, _ = run("topr", batch, logprobs, old, advantages, "seq-mean-token-sum")
    sum_lp = float(logprobs.detach()[batch.loss_mask].sum())
    assert value.item() == pytest.approx(-alpha * reward * sum_lp, rel=1e-6)
    (grad,) = torch.autograd.grad(value, logprobs)
    assert grad[batch.loss_mask].tolist() == pytest.approx([-alpha * reward] * 2, rel=1e-6)


def test_topr_matches_a_looped_sequence_reference(make_batch):
    batch, logprobs, old, advantages, per_seq = random_case(make_batch, 2, noise=0.4)
    value, metrics = run("topr", batch, logprobs, old, advantages, "seq-mean-token-sum")
    terms = []
    for i, where in sequences(batch):
        rho = math.exp(float((logprobs[where] - old[where]).sum().detach()))
        alpha = 1.0 if per_seq[i] >= 0 else min(rho, 1.0)
        terms.append(-alpha * per_seq[i] * logprobs[where].sum())
    reference = torch.stack(terms).mean()  # (1/N) Σ_i −α_i R_i Σ_t ℓ
    torch.testing.assert_close(value, reference)
    torch.testing.assert_close(
        torch.autograd.grad(value, logprobs)[0], torch.autograd.grad(reference, logprobs)[0]
    )
    assert 0 < metrics["topr/negative_fraction"] < 1


def test_topr_threshold_moves_the_sign_test(make_batch, place_values):
    batch, logprobs, old, advantages = one_sequence(make_batch, place_values, [-0.25, -0.25], 0.3)
    plain, _ = run("topr", batch, logprobs, old, advantages, "seq-mean-token-sum")
    shifted, _ = run("topr", batch, logprobs, old, advantages, "seq-mean-token-sum", threshold=0.5)
    (g_plain,) = torch.autograd.grad(plain, logprobs)
    (g_shifted,) = torch.autograd.grad(shifted, logprobs)
    assert g_plain[batch.loss_mask].tolist() == pytest.approx([-0.3, -0.3])
    assert g_shifted[batch.loss_mask].tolist() == pytest.approx([-0.3 * 0.6065307] * 2, rel=1e-6)


def test_topr_token_variant_tapers_each_token(make_batch, place_values):
    # Σ log ρ = 0 (sequence ratio 1: no taper), but the second token alone has ρ = e^−0.5.
    batch, logprobs, old, advantages = one_sequence(make_batch, place_values, [0.5, -0.5], -1.0)
    seq, _ = run("topr", batch, logprobs, old, advantages, "seq-mean-token-sum")
    tok, _ = run("topr_token", batch, logprobs, old, advantages, "token-mean")
    (g_seq,) = torch.autograd.grad(seq, logprobs)
    (g_tok,) = torch.autograd.grad(tok, logprobs)
    assert g_seq[batch.loss_mask].tolist() == pytest.approx([1.0, 1.0])
    assert g_tok[batch.loss_mask].tolist() == pytest.approx([0.5, 0.5 * 0.6065307], rel=1e-6)


# ---- PPO sequence form (§7) ---------------------------------------------------------------------------


def test_ppo_seq_matches_a_looped_sequence_reference(make_batch):
    batch, logprobs, old, advantages, per_seq = random_case(make_batch, 3, noise=0.1)
    value, _ = run("ppo_seq", batch, logprobs, old, advantages, "seq-mean-token-mean")
    terms = []
    for i, where in sequences(batch):
        rho = torch.exp((logprobs[where] - old[where]).sum())  # not length-normalised
        a = per_seq[i]
        terms.append(torch.maximum(-a * rho, -a * rho.clamp(0.8, 1.2)))
    reference = torch.stack(terms).mean()
    torch.testing.assert_close(value, reference)
    torch.testing.assert_close(
        torch.autograd.grad(value, logprobs)[0], torch.autograd.grad(reference, logprobs)[0]
    )


def test_ppo_seq_on_policy_is_sequence_reinforce(make_batch):
    batch, logprobs, _, advantages, per_seq = random_case(make_batch, 4)
    value, _ = run("ppo_seq", batch, logprobs, logprobs.detach(), advantages, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(value, logprobs)
    n_seqs = sum(1 for _ in sequences(batch))
    for i, where in sequences(batch):  # ∇ = −A_i Σ_t ∇ℓ / N: every token of sequence i gets −A_i / N
        torch.testing.assert_close(grad[where], torch.full_like(grad[where], -float(per_seq[i]) / n_seqs))


def test_bad_clip_args_are_refused(make_batch):
    batch, logprobs, old, advantages, _ = random_case(make_batch, 5)
    inputs = PolicyLossInputs(logprobs, old, advantages, batch.loss_mask, batch.seq_index)
    for name in ("gspo", "ppo_seq"):
        with pytest.raises(ValueError, match="clip_low, clip_high >= 0"):
            POLICY_LOSS_FNS.get(name)(inputs, clip_low=-1.0)
