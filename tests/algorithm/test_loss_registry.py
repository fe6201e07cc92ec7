"""The new losses are registered under their documented names with the defaults of docs/algorithms.md."""

import inspect

import pytest

from trivium.algorithm import AGGREGATIONS, POLICY_LOSS_FNS

DEFAULTS = {
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4},  # §9
    "cispo": {"clip_low": 1.0, "clip_high": 0.28, "mask_clip_low": None, "mask_clip_high": None},  # §10
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},  # §11
    "topr": {"threshold": 0.0},  # §12
    "topr_token": {"threshold": 0.0},
    "sppo": {"epsilon": 0.3},  # §13
    "rec": {  # §15: REC-OneSide-NoIS, ε = 0.2, ε' = 0.6 / 2.0, τ = 1, c = 0
        "clip_mode": "one-side",
        "weight": "none",
        "regulariser": "none",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "ring_low": 0.6,
        "ring_high": 2.0,
        "tau": 1.0,
        "reg_coef": 0.0,
    },
    "chord": {  # §16: CHORD-μ reference schedule, PPO ε = 0.2
        "mu": None,
        "warmup_steps": 0,
        "decay_steps": 200,
        "mu_peak": 0.9,
        "mu_valley": 0.05,
        "phi": False,
        "clip_low": 0.2,
        "clip_high": 0.2,
    },
    "ppo_seq": {"clip_low": 0.2, "clip_high": 0.2},  # §7 sequence form
    "is_pg": {},  # §19
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_registered_with_spec_defaults(name):
    params = list(inspect.signature(POLICY_LOSS_FNS.get(name)).parameters.values())[1:]
    assert {p.name: p.default for p in params} == DEFAULTS[name]
    assert all(p.kind is p.KEYWORD_ONLY for p in params)
    POLICY_LOSS_FNS.check_args(name, DEFAULTS[name])


def test_chord_aggregation_is_registered():
    assert "chord" in AGGREGATIONS
