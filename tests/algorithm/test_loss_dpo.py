"""DPO (docs/algorithms.md §18): worked numbers, gradient, summed log-probs and explicit pairing."""

import math

import pytest
import torch

from trivium.algorithm import sequence_sums
from trivium.algorithm.losses_preference import dpo_loss, pair_logprobs


def worked(h_chosen=(-10.0, -11.0), h_rejected=(-12.0, -11.5), **args):
    pc = torch.tensor([h_chosen[0]], requires_grad=True)
    pr = torch.tensor([h_rejected[0]], requires_grad=True)
    rc = torch.tensor([h_chosen[1]], requires_grad=True)  # a reference that (wrongly) tracks gradients
    rr = torch.tensor([h_rejected[1]])
    loss, metrics = dpo_loss(pc, pr, rc, rr, **args)
    loss.backward()
    return loss, metrics, pc, pr, rc


def test_worked_example_value_gradient_and_metrics():
    loss, metrics, pc, pr, rc = worked()  # h = (−10 + 11) − (−12 + 11.5) = 1.5, βh = 0.15
    assert loss.item() == pytest.approx(0.6209570, rel=1e-6)
    assert -0.1 / (1 + math.exp(0.15)) == pytest.approx(-0.0462570, rel=1e-5)  # −βσ(−βh)
    assert pc.grad.item() == pytest.approx(-0.0462570, rel=1e-5)  # ∂h/∂log π(y_w) = +1
    assert pr.grad.item() == pytest.approx(0.0462570, rel=1e-5)  # ∂h/∂log π(y_l) = −1
    assert rc.grad is None  # the reference is detached
    assert metrics["rewards/chosen"] == pytest.approx(0.1)
    assert metrics["rewards/rejected"] == pytest.approx(-0.05)
    assert metrics["rewards/margin"] == pytest.approx(0.15)
    assert metrics["rewards/accuracy"] == 1.0


def test_label_smoothing_and_zero_margin():
    assert worked(label_smoothing=0.1)[0].item() == pytest.approx(0.6359570, rel=1e-6)
    loss, metrics, *_ = worked(h_chosen=(-10.0, -10.0), h_rejected=(-12.0, -12.0))
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert metrics["rewards/accuracy"] == 0.0  # a tie is not a win


def test_extreme_margins_stay_finite():
    big = torch.tensor([1e5, -1e5])
    loss, _ = dpo_loss(big, -big, torch.zeros(2), torch.zeros(2))
    assert loss.item() == pytest.approx((0.0 + 0.1 * 2e5) / 2)  # softplus, not log(sigmoid) underflow


def test_loss_is_the_mean_over_pairs():
    pc, pr = torch.tensor([-10.0, -3.0]), torch.tensor([-12.0, -1.0])
    ref = torch.tensor([-11.0, -2.0]), torch.tensor([-11.5, -2.0])
    both, _ = dpo_loss(pc, pr, *ref)
    singles = [
        dpo_loss(pc[i : i + 1], pr[i : i + 1], ref[0][i : i + 1], ref[1][i : i + 1])[0] for i in range(2)
    ]
    assert both.item() == pytest.approx((singles[0].item() + singles[1].item()) / 2)


def test_micro_batch_shares_sum_to_the_mini_batch_mean():
    gen = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-10 * torch.rand(5, generator=gen) for _ in range(4))
    whole, _ = dpo_loss(pc, pr, rc, rr)
    parts = [dpo_loss(pc[s], pr[s], rc[s], rr[s], num_pairs=5)[0] for s in (slice(0, 2), slice(2, 5))]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"num_pairs=1 .* must be >= the 2 pairs given"):
        dpo_loss(pc[:2], pr[:2], rc[:2], rr[:2], num_pairs=1)


def test_explicit_pairs_on_packed_rows_not_row_order(make_batch, place_values):
    # Four responses packed into rows in the order rejected_A, chosen_B, chosen_A, rejected_B.
    batch = make_batch([2, 3, 1, 2], pack_length=64)
    assert batch.num_rows == 1
    policy = place_values(batch, [[-4.0, -2.0], [-1.0, -1.0, -0.5], [-0.5], [-3.0, -3.0]], fill=-99.0)
    ref = place_values(batch, [[-3.0, -2.0], [-1.0, -1.5, -1.0], [-1.0], [-2.0, -2.0]], fill=-99.0)
    seq_policy = sequence_sums(policy, batch.loss_mask, batch.seq_index, 4)
    seq_ref = sequence_sums(ref, batch.loss_mask, batch.seq_index, 4)
    assert seq_policy.tolist() == [-6.0, -2.5, -0.5, -6.0]  # sums, not means

    chosen, rejected = torch.tensor([2, 1]), torch.tensor([0, 3])
    loss, metrics = dpo_loss(
        *pair_logprobs(seq_policy, chosen, rejected), *pair_logprobs(seq_ref, chosen, rejected)
    )
    looped = []
    for c, r in zip(chosen.tolist(), rejected.tolist()):
        h = (seq_policy[c] - seq_ref[c]) - (seq_policy[r] - seq_ref[r])
        looped.append(-math.log(1 / (1 + math.exp(-0.1 * float(h)))))
    assert loss.item() == pytest.approx(sum(looped) / 2, rel=1e-6)
    assert metrics["rewards/accuracy"] == 1.0

    by_row_order = torch.tensor([0, 2]), torch.tensor([1, 3])  # "even = chosen": the mis-pairing
    wrong, _ = dpo_loss(*pair_logprobs(seq_policy, *by_row_order), *pair_logprobs(seq_ref, *by_row_order))
    assert abs(wrong.item() - loss.item()) > 1e-3
    lengths = sequence_sums(torch.ones_like(policy), batch.loss_mask, batch.seq_index, 4)
    means = seq_policy / lengths, seq_ref / lengths  # the length-normalised pitfall gives another loss too
    mean_loss, _ = dpo_loss(
        *pair_logprobs(means[0], chosen, rejected), *pair_logprobs(means[1], chosen, rejected)
    )
    assert abs(mean_loss.item() - loss.item()) > 1e-3


def test_bad_pairs_and_args_are_refused():
    seq = torch.tensor([-1.0, -2.0, -3.0])
    with pytest.raises(ValueError, match="pair 1 uses sequence 2 as both chosen and rejected"):
        pair_logprobs(seq, torch.tensor([0, 2]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"rejected ids must be sequence ids in \[0, 3\)"):
        pair_logprobs(seq, torch.tensor([0]), torch.tensor([3]))
    with pytest.raises(ValueError, match="both be \\[P\\] sequence ids"):
        pair_logprobs(seq, torch.tensor([0, 1]), torch.tensor([2]))
    one = torch.zeros(1)
    with pytest.raises(ValueError, match="four \\[P\\] tensors"):
        dpo_loss(one, torch.zeros(2), one, one)
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(one, one, one, one, beta=0.0)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 0\.5\)"):
        dpo_loss(one, one, one, one, label_smoothing=0.5)
