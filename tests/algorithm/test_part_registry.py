import sys
import textwrap

import pytest
import torch

from trivium.algorithm import (
    POLICY_LOSS_FNS,
    PolicyLossInputs,
    Registry,
    UnknownPartError,
    actor_loss,
    loss_scale,
)


@pytest.fixture
def registry():
    reg = Registry("widget")
    reg.register("alpha")(lambda x: x)
    reg.register("beta")(lambda x: 2 * x)
    return reg


def test_lookup_names_and_contains(registry):
    assert registry.get("beta")(3) == 6
    assert registry.names() == ["alpha", "beta"]
    assert "alpha" in registry and "gamma" not in registry


def test_duplicate_name_raises(registry):
    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        registry.register("alpha")(lambda x: x)


def test_miss_lists_valid_names_and_the_nearest(registry):
    with pytest.raises(UnknownPartError) as err:
        registry.get("alpah")
    assert isinstance(err.value, KeyError)
    assert str(err.value).startswith("unknown widget 'alpah'. did you mean 'alpha'? valid: alpha, beta")
    assert err.value.rule == "unknown widget 'alpah'" and err.value.fix.startswith("did you mean 'alpha'?")
    with pytest.raises(KeyError, match="valid: alpha, beta"):
        registry.get("zzz")


def test_colon_is_reserved_for_dotted_paths(registry):
    with pytest.raises(ValueError, match="must not contain ':'"):
        registry.register("a:b")


def test_snapshot_restores_even_after_an_error(registry):
    with pytest.raises(RuntimeError), registry.snapshot():
        registry.register("gamma")(lambda x: x)
        assert "gamma" in registry
        raise RuntimeError
    assert registry.names() == ["alpha", "beta"]


def test_dotted_path_imports_a_users_loss(tmp_path, monkeypatch):
    # A user's module that also registers its loss under a name: the snapshot keeps that from leaking.
    (tmp_path / "my_trivium_plugin.py").write_text(
        textwrap.dedent(
            """
            import torch
            from trivium.algorithm import POLICY_LOSS_FNS

            @POLICY_LOSS_FNS.register("half_nll")
            def half_nll(inputs, *, weight=0.5):
                return torch.where(inputs.mask, -weight * inputs.logprobs, 0.0), {"half/weight": weight}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_trivium_plugin", raising=False)
    logprobs = torch.tensor([[-1.0, -3.0]])
    mask = torch.tensor([[True, True]])
    seq_index = torch.zeros(1, 2, dtype=torch.long)
    inputs = PolicyLossInputs(logprobs, logprobs, torch.zeros(1, 2), mask, seq_index)
    scale = loss_scale(mask, seq_index, norm_constant=2)
    try:
        with POLICY_LOSS_FNS.snapshot():
            fn = POLICY_LOSS_FNS.get("my_trivium_plugin:half_nll")
            assert "half_nll" in POLICY_LOSS_FNS and fn.__name__ == "half_nll"
            loss, metrics = actor_loss(
                inputs,
                policy_loss="my_trivium_plugin:half_nll",
                policy_loss_args={"weight": 0.25},
                aggregation="token-mean",
                scale=scale,
            )
            assert float(loss) == pytest.approx(0.25 * (1.0 + 3.0) / 2)
            assert metrics["half/weight"] == 0.25
    finally:
        sys.modules.pop("my_trivium_plugin", None)
    assert "half_nll" not in POLICY_LOSS_FNS


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("trivium.algorithm.kl:k9", "has no attribute 'k9'"),
        ("trivium.algorithm.presets:PRESETS", "is a Registry, not a function"),
        ("os:system", "not taken from Python.s standard library"),
        (".rel:x", "not a valid import path"),
        (":", "not a valid import path"),
    ],
)
def test_dotted_path_errors_name_the_problem(path, message):
    with pytest.raises(UnknownPartError, match=message):
        POLICY_LOSS_FNS.get(path)


def test_check_args(registry):
    POLICY_LOSS_FNS.check_args("ppo_clip", {"clip_low": 0.2, "dual_clip": 3.0})
    POLICY_LOSS_FNS.check_args("sft", {})
    with pytest.raises(
        TypeError, match=r"policy loss 'sft' got unknown args \['clip_low'\]; valid args: none"
    ):
        POLICY_LOSS_FNS.check_args("sft", {"clip_low": 0.2})
    registry.register("anything")(lambda inputs, **kw: inputs)
    registry.check_args("anything", {"whatever": 1})
