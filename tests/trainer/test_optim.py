"""trainer.optimizer_impl: every AdamW implementation makes the same update, and a checkpoint written by one
resumes under another; trainer.optimizer_state_dtype bfloat16: stochastically rounded moments that track
float32 AdamW with half the state."""

from __future__ import annotations

import copy

import pytest
import torch

from trivium.config.schema import TrainerConfig
from trivium.trainer.adamw_bf16 import Bf16StateAdamW, rounding_noise, stochastic_round_to_bf16
from trivium.trainer.optim import Optimization, adamw_implementation, build_optimizer

IMPLS = ["fused", "foreach", "for_loop"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _train(model: torch.nn.Module, optim: Optimization, steps: range) -> None:
    for step in steps:
        torch.manual_seed(100 + step)  # the same data at each step whatever ran before
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        optim.backward(torch.nn.functional.mse_loss(model(x), y))
        optim.step()


def _cfg(impl: str) -> TrainerConfig:
    return TrainerConfig(
        lr=0.05, weight_decay=0.1, warmup_steps=2, lr_scheduler="cosine", optimizer_impl=impl
    )


def test_auto_picks_the_fused_kernel_on_cpu_and_for_loop_where_there_is_none():
    params = list(_model().parameters())
    assert adamw_implementation(params, "auto") == "fused"
    assert build_optimizer(params, TrainerConfig()).defaults["fused"] is True
    assert adamw_implementation([torch.zeros(2, dtype=torch.int64)], "auto") == "for_loop"
    for impl in IMPLS:
        assert adamw_implementation(params, impl) == impl


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_every_implementation_makes_the_for_loop_update(impl):
    reference, other = _model(), _model()
    ref_optim, optim = Optimization(reference, _cfg("for_loop")), Optimization(other, _cfg(impl))
    ref_optim.plan(10)
    optim.plan(10)
    assert optim.optimizer.defaults["fused" if impl == "fused" else "foreach"] is True
    _train(reference, ref_optim, range(10))
    _train(other, optim, range(10))
    moved = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), _model().parameters()))
    assert moved > 0.1  # it trained
    for a, b in zip(reference.parameters(), other.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("before", "after"), [("for_loop", "fused"), ("fused", "for_loop")])
def test_a_checkpoint_resumes_under_another_implementation(before, after):
    straight = _model()
    straight_optim = Optimization(straight, _cfg(before))
    straight_optim.plan(8)
    _train(straight, straight_optim, range(8))

    first = _model()
    first_optim = Optimization(first, _cfg(before))
    first_optim.plan(8)
    _train(first, first_optim, range(4))
    saved_weights, saved_state = copy.deepcopy(first.state_dict()), copy.deepcopy(first_optim.state_dict())

    resumed = _model()
    resumed.load_state_dict(saved_weights)
    resumed_optim = Optimization(resumed, _cfg(after))
    resumed_optim.load_state_dict(saved_state)
    assert resumed_optim.lr == pytest.approx(first_optim.lr)
    _train(resumed, resumed_optim, range(4, 8))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


# --- trainer.optimizer_state_dtype: bfloat16 ---------------------------------------------------------------


def test_stochastic_rounding_is_exact_in_expectation_and_lands_on_a_neighbour():
    gen = torch.Generator().manual_seed(0)
    base = torch.tensor([1.0, -3.0, 2.0**-13, 250.0])  # bf16 numbers
    step = torch.tensor([2.0**-7, 2.0**-6, 2.0**-20, 1.0])  # bf16's spacing above each
    x = base + torch.sign(base) * 0.3 * step  # 30% of the way to the next bf16 number away from 0
    draws = torch.stack([stochastic_round_to_bf16(x, rounding_noise(x, gen)).float() for _ in range(4000)])
    low, high = base, base + torch.sign(base) * step
    assert bool(((draws == low) | (draws == high)).all())
    torch.testing.assert_close(draws.mean(0), x, rtol=0, atol=float(0.05 * step.max()))
    assert abs(float((draws[:, 0] == high[0]).float().mean()) - 0.3) < 0.03
    exact = torch.tensor([1.0, -0.5, 0.0, 3.0])  # values that are bf16 already stay exactly
    assert torch.equal(stochastic_round_to_bf16(exact, rounding_noise(exact, gen)).float(), exact)


def test_the_second_moment_keeps_moving_where_rounding_to_nearest_would_freeze_it():
    p = torch.nn.Parameter(torch.zeros(20_000))
    optimizer = Bf16StateAdamW([p], lr=1e-9)
    for _ in range(2000):
        p.grad = torch.full_like(p, 0.5)
        optimizer.step()
    # exact: (1 - 0.999^2000) * 0.25 = 0.2162; nearest rounding stalls near 0.06 (0.1% steps under bf16's 0.4%)
    got = float(optimizer.state[p]["exp_avg_sq"].float().mean())
    assert optimizer.state[p]["exp_avg_sq"].dtype == torch.bfloat16
    assert abs(got - (1 - 0.999**2000) * 0.25) < 0.01 * 0.25


def test_bf16_moments_train_like_float32_ones_with_half_the_state():
    reference, other = _model(), _model()
    ref_optim = Optimization(reference, _cfg("auto"))
    optim = Optimization(other, _cfg("auto").model_copy(update={"optimizer_state_dtype": "bfloat16"}))
    assert isinstance(optim.optimizer, Bf16StateAdamW)
    ref_optim.plan(20)
    optim.plan(20)
    _train(reference, ref_optim, range(20))
    _train(other, optim, range(20))
    start = _model()
    for a, b, s in zip(reference.parameters(), other.parameters(), start.parameters()):
        moved = (a - s).norm()
        assert (a - b).norm() < 0.02 * moved  # the same trajectory up to the moments' rounding
    ref_mb = ref_optim.footprint()["train/optimizer_mb"]
    assert optim.footprint()["train/optimizer_mb"] == pytest.approx(ref_mb / 2, rel=0.01)


def test_bf16_moments_resume_exactly_and_from_a_float32_state():
    cfg = _cfg("auto").model_copy(update={"optimizer_state_dtype": "bfloat16"})
    straight = _model()
    straight_optim = Optimization(straight, cfg)
    straight_optim.plan(8)
    _train(straight, straight_optim, range(8))
    for before in (cfg, _cfg("fused")):
        first = _model()
        first_optim = Optimization(first, before)
        first_optim.plan(8)
        _train(first, first_optim, range(4))
        resumed = _model()
        resumed.load_state_dict(copy.deepcopy(first.state_dict()))
        resumed_optim = Optimization(resumed, cfg)
        resumed_optim.load_state_dict(copy.deepcopy(first_optim.state_dict()))
        state = resumed_optim.optimizer.state[next(resumed.parameters())]
        assert state["exp_avg"].dtype == torch.bfloat16
        _train(resumed, resumed_optim, range(4, 8))
        for a, b in zip(straight.parameters(), resumed.parameters()):
            if before is cfg:  # the same rounding draws: bit for bit
                assert torch.equal(a, b)
            else:  # from float32 moments: rounded once at the load
                torch.testing.assert_close(a, b, rtol=0, atol=2e-3)
