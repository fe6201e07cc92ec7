import math

import pytest
import torch

from trivium.algorithm import KL_FNS

# docs/algorithms.md §2.1: ℓ = −1.0, ℓref = −1.5 ⇒ δ = 0.5.
DELTA = 0.5
EXPECTED = {
    "k1": DELTA,  # 0.5
    "k2": 0.5 * DELTA**2,  # 0.125
    "k3": math.exp(-DELTA) + DELTA - 1,  # 0.1065307
    "low_var_kl": math.exp(-DELTA) + DELTA - 1,
    "abs": abs(DELTA),
}
# Gradients in ℓ: d k1 = 1, d k2 = δ, d k3 = 1 − e^{−δ}, d |δ| = sign δ.
EXPECTED_GRAD = {
    "k1": 1.0,
    "k2": DELTA,
    "k3": 1 - math.exp(-DELTA),
    "low_var_kl": 1 - math.exp(-DELTA),
    "abs": 1.0,
}


def test_every_estimator_is_tested():
    assert sorted(EXPECTED) == KL_FNS.names()


def test_documented_rounded_values():
    assert (EXPECTED["k1"], EXPECTED["k2"]) == (0.5, 0.125)
    assert EXPECTED["k3"] == pytest.approx(0.1065307, abs=1e-7)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_worked_example_value_and_gradient(name):
    logprobs = torch.tensor([[-1.0]], requires_grad=True)
    kl = KL_FNS.get(name)(logprobs, torch.tensor([[-1.5]]))
    assert kl.shape == (1, 1)
    assert kl.item() == pytest.approx(EXPECTED[name], rel=1e-6)
    kl.sum().backward()
    assert logprobs.grad.item() == pytest.approx(EXPECTED_GRAD[name], rel=1e-5)


def test_k3_is_non_negative_and_k2_k3_vanish_on_the_reference():
    logprobs, ref = -torch.rand(64, 32) * 8, -torch.rand(64, 32) * 8
    assert (KL_FNS.get("k3")(logprobs, ref) >= 0).all()
    assert (KL_FNS.get("k2")(logprobs, ref) >= 0).all()
    for name in ("k1", "k2", "k3", "abs"):
        assert (KL_FNS.get(name)(logprobs, logprobs) == 0).all()


def test_k3_guards_keep_far_apart_policies_finite():
    # ℓref − ℓ = 100 would overflow exp in float32 without the [−20, 20] clamp; the value is capped at 10.
    logprobs = torch.tensor([[-100.0, 0.0]], requires_grad=True)
    kl = KL_FNS.get("k3")(logprobs, torch.tensor([[0.0, -100.0]]))
    assert torch.isfinite(kl).all() and (kl <= 10).all()
    assert kl[0, 0].item() == 10.0
    kl.sum().backward()
    assert torch.isfinite(logprobs.grad).all()
