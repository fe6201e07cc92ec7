import pytest

from trivium.algorithm import (
    ADVANTAGE_FNS,
    AGGREGATIONS,
    KL_FNS,
    POLICY_LOSS_FNS,
    PRESETS,
    UnknownPartError,
    get_preset,
)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_part_a_preset_names_exists_with_valid_args(name):
    preset = get_preset(name)
    assert preset.name == name
    assert preset.policy_loss_fn in POLICY_LOSS_FNS
    POLICY_LOSS_FNS.check_args(preset.policy_loss_fn, preset.policy_loss_args)
    assert preset.aggregation in AGGREGATIONS
    if preset.advantage_fn is None:
        assert not preset.advantage_args
    else:
        assert preset.advantage_fn in ADVANTAGE_FNS
        ADVANTAGE_FNS.check_args(preset.advantage_fn, preset.advantage_args)
    assert preset.kl_estimator is None or preset.kl_estimator in KL_FNS
    assert preset.description


def test_grpo_and_sft_presets_follow_the_spec():
    grpo = get_preset("grpo")
    assert (grpo.advantage_fn, grpo.policy_loss_fn, grpo.aggregation) == ("grpo", "ppo_clip", "token-mean")
    assert dict(grpo.policy_loss_args) == {"clip_low": 0.2, "clip_high": 0.2}
    assert dict(grpo.advantage_args) == {"std_normalize": True, "epsilon": 1e-6}
    assert grpo.needs_rollouts and grpo.kl_estimator == "k3"
    sft = get_preset("sft")
    assert (sft.advantage_fn, sft.policy_loss_fn, sft.needs_rollouts) == (None, "sft", False)


def test_preset_args_are_read_only():
    with pytest.raises(TypeError):
        get_preset("grpo").policy_loss_args["clip_low"] = 0.3  # type: ignore[index]


def test_unknown_preset_lists_names():
    with pytest.raises(UnknownPartError, match=r"unknown algorithm 'gpro'\..*valid: .*grpo, .*gspo"):
        get_preset("gpro")


ISSUE_ALGORITHMS = [
    "ppo",
    "grpo",
    "sft",
    "dpo",
    "mix_chord",
    "rec",
    "rloo",
    "reinforceplusplus",
    "reinforceplusplus_baseline",
    "gspo",
    "topr",
    "sppo",
    "asymre",
    "cispo",
    "sapo",
    "on_policy_distill",
    "jsd",
    "dr_grpo",
    "dapo",
]


def test_every_algorithm_of_the_mission_has_a_preset():
    assert set(ISSUE_ALGORITHMS) <= set(PRESETS)
