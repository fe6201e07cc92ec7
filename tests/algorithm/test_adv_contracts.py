"""What every advantage function of the registry promises, checked on each one with its default args."""

import dataclasses

import pytest
import torch

from trivium.algorithm import ADVANTAGE_FNS, AdvantageInputs

NAMES = [
    "grpo",
    "rec",
    "rloo",
    "asymre",
    "reinforceplusplus_baseline",
    "reinforceplusplus",
    "gae",
    "on_policy_distill",
    "jsd_distill",
]
OPTIONAL = ("token_rewards", "values", "old_logprobs", "ref_logprobs", "teacher_logprobs")

# Two groups of three; sequence 1 and 4 have tool tokens inside, sequence 5 ends with one.
RESPONSES = [3, [True, False, False, True, True], 1, 4, [True, True, False, True], [True, True, False]]
WITHOUT_HOLES = [3, 3, 1, 4, 3, 2]
REWARDS = [1.0, 0.0, 0.5, 0.2, 0.9, 0.0]
GROUPS = [4, 4, 4, 1, 1, 1]


def per_token_values(seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen).tolist() for n in WITHOUT_HOLES]


def full_inputs(make_batch, place_values, responses=RESPONSES, pack_length=None, fill=0.0, grad=False):
    """Every optional input filled (values on the action tokens always the same; ``fill`` elsewhere)."""
    batch = make_batch(responses, rewards=REWARDS, group_ids=GROUPS, pack_length=pack_length)
    inputs = AdvantageInputs.from_batch(batch)
    extra = {}
    for k, name in enumerate(OPTIONAL):
        value = place_values(batch, per_token_values(k), fill=fill)
        if name.endswith("logprobs"):
            value = torch.where(batch.loss_mask, -value.abs(), value)
        extra[name] = value.requires_grad_(grad)
    rewards = inputs.rewards.clone().requires_grad_(grad)
    return batch, dataclasses.replace(inputs, rewards=rewards, **extra)


def by_sequence(adv, batch):
    """Each sequence's advantages on its action tokens, in order (layout-independent)."""
    return [adv[(batch.seq_index == i) & batch.loss_mask].tolist() for i in range(batch.num_seqs)]


@pytest.mark.parametrize("name", NAMES)
def test_output_is_detached_float_and_zero_off_the_mask(make_batch, place_values, name):
    batch, inputs = full_inputs(make_batch, place_values, grad=True)
    adv, metrics = ADVANTAGE_FNS.get(name)(inputs)
    assert adv.shape == batch.loss_mask.shape and adv.is_floating_point()
    assert not adv.requires_grad and adv.grad_fn is None
    assert (adv[~batch.loss_mask] == 0).all() and torch.isfinite(adv).all()
    assert metrics and all(type(v) is float for v in metrics.values())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fill", [float("nan"), 1e6], ids=["nan", "huge"])
def test_values_off_the_mask_change_nothing(make_batch, place_values, name, fill):
    """Prompt, padding and tool positions may hold anything: no sum, mean or variance sees them."""
    _, clean = full_inputs(make_batch, place_values)
    _, junk = full_inputs(make_batch, place_values, fill=fill)
    fn = ADVANTAGE_FNS.get(name)
    torch.testing.assert_close(fn(junk)[0], fn(clean)[0])


@pytest.mark.parametrize("name", NAMES)
def test_tool_tokens_and_packing_change_nothing(make_batch, place_values, name):
    """Removing the tool-token holes, or packing rows, leaves every action token's advantage as it was
    (holes are skipped by returns and excluded from whitening statistics; rows are not sequences)."""
    fn = ADVANTAGE_FNS.get(name)
    batch, inputs = full_inputs(make_batch, place_values)
    reference = by_sequence(fn(inputs)[0], batch)
    for responses, pack_length in [(WITHOUT_HOLES, None), (RESPONSES, 16), (WITHOUT_HOLES, 9)]:
        other_batch, other = full_inputs(make_batch, place_values, responses, pack_length)
        got = by_sequence(fn(other)[0], other_batch)
        for mine, ref in zip(got, reference):
            assert mine == pytest.approx(ref, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    ("name", "missing", "provider"),
    [
        ("gae", "values", "algorithm_type ppo"),
        ("gae", "token_rewards", "kl_penalty_token_rewards"),
        ("reinforceplusplus", "token_rewards", "outcome_token_rewards"),
        ("on_policy_distill", "teacher_logprobs", "auxiliary_models"),
        ("on_policy_distill", "old_logprobs", "behaviour policy"),
        ("jsd_distill", "teacher_logprobs", "algorithm.teacher"),
        ("jsd_distill", "old_logprobs", "behaviour policy"),
    ],
)
def test_missing_optional_input_names_it_and_its_provider(make_batch, place_values, name, missing, provider):
    _, inputs = full_inputs(make_batch, place_values)
    with pytest.raises(ValueError, match=rf"{name} needs inputs\.{missing}: .*{provider}"):
        ADVANTAGE_FNS.get(name)(dataclasses.replace(inputs, **{missing: None}))


@pytest.mark.parametrize("name", ["grpo", "rec", "rloo", "asymre", "reinforceplusplus_baseline", "gae"])
def test_needs_no_more_than_it_says(make_batch, place_values, name):
    """Group estimators run on rewards alone; gae needs nothing but values and token rewards."""
    _, inputs = full_inputs(make_batch, place_values)
    keep = {"values", "token_rewards"} if name == "gae" else set()
    stripped = dataclasses.replace(inputs, **{k: None for k in OPTIONAL if k not in keep})
    fn = ADVANTAGE_FNS.get(name)
    torch.testing.assert_close(fn(stripped)[0], fn(inputs)[0])
