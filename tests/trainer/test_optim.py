"""trainer.optimizer_impl: every AdamW implementation makes the same update, and a checkpoint written by one
resumes under another."""

from __future__ import annotations

import copy

import pytest
import torch

from trivium.config.schema import TrainerConfig
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
