"""PPO's clipped value loss (docs/algorithms.md §3) and its metrics."""

import math

import pytest
import torch

from trivium.algorithm import loss_scale
from trivium.algorithm.losses_value import value_loss


def one_token(v, v_old, ret, **args):
    values = torch.tensor([[v, 50.0]], requires_grad=True)  # the second token is masked junk
    mask = torch.tensor([[True, False]])
    seq_index = torch.zeros(1, 2, dtype=torch.long)
    scale = loss_scale(mask, seq_index, 8)
    loss, metrics = value_loss(
        values,
        torch.tensor([[v_old, -50.0]]),
        torch.tensor([[ret, 0.0]]),
        mask,
        seq_index,
        scale=scale,
        **args,
    )
    loss.backward()
    return loss.item(), values.grad[0].tolist(), metrics


def test_worked_example():
    # V^old = 0.5, V = 1.2, Ret = 1.0, ε_V = 0.5 ⇒ V^clip = 1.0, ½·max(0.04, 0) = 0.02, unclipped branch.
    loss, grad, metrics = one_token(1.2, 0.5, 1.0)
    assert loss == pytest.approx(0.02, rel=1e-5)
    assert grad == pytest.approx([0.2, 0.0], rel=1e-5)  # V − Ret; masked token: nothing
    assert metrics["value/clip_fraction"] == 0.0 and metrics["loss/value"] == pytest.approx(0.02, rel=1e-5)


def test_clipped_branch_has_zero_gradient():
    # V = 1.0 moved past V^old + 0.5 = 0.5 away from Ret = 2: max(1, 2.25) picks the clipped 1.5² branch.
    loss, grad, metrics = one_token(1.0, 0.0, 2.0)
    assert loss == pytest.approx(0.5 * 2.25)
    assert grad == [0.0, 0.0]
    assert metrics["value/clip_fraction"] == 1.0
    loss, grad, _ = one_token(1.0, 0.0, 2.0, clip=None)  # unclipped: ½(V − Ret)²
    assert loss == pytest.approx(0.5) and grad == pytest.approx([-1.0, 0.0])
    with pytest.raises(ValueError, match="clip \\(ε_V\\) must be > 0 or None"):
        one_token(1.0, 0.0, 2.0, clip=0.0)


def test_aggregation_explained_variance_and_detached_targets(make_batch, place_values):
    batch = make_batch([3, [True, False, True], 2], pack_length=16)
    v = [[0.1, 0.5, 0.9], [0.2, 0.4], [1.0, 0.0]]
    ret = [[0.0, 0.6, 1.0], [0.5, 0.5], [1.2, -0.2]]
    values = place_values(batch, v, fill=100.0).requires_grad_(True)
    returns = place_values(batch, ret, fill=-100.0).requires_grad_(True)
    mask, seq = batch.loss_mask, batch.seq_index
    scale = loss_scale(mask, seq, 8)
    loss, metrics = value_loss(
        values, values.detach(), returns, mask, seq, scale=scale, aggregation="seq-mean-token-mean"
    )
    per_seq = [sum(0.5 * (a - b) ** 2 for a, b in zip(vs, rs)) / len(vs) for vs, rs in zip(v, ret)]
    assert loss.item() == pytest.approx(sum(per_seq) / 3, rel=1e-6)  # V^old = V: never clipped
    loss.backward()
    assert returns.grad is None or (returns.grad == 0).all()

    flat_v = torch.tensor([x for s in v for x in s], dtype=torch.float64)
    flat_r = torch.tensor([x for s in ret for x in s], dtype=torch.float64)
    explained = 1 - (flat_r - flat_v).var() / flat_r.var()  # same with either variance normalisation
    assert metrics["value/explained_variance"] == pytest.approx(float(explained), rel=1e-5)
    assert metrics["value/mean"] == pytest.approx(float(flat_v.mean()), rel=1e-6)

    constant = place_values(batch, [[1.0] * 3, [1.0] * 2, [1.0] * 2])
    _, metrics = value_loss(values, values.detach(), constant, mask, seq, scale=scale)
    assert math.isnan(metrics["value/explained_variance"])  # undefined, not a misleading number
