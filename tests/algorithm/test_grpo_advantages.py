import math

import pytest
import torch

from trivium.algorithm import ADVANTAGE_FNS, AdvantageInputs
from trivium.algorithm.advantages import grpo

EPS = 1e-6


def seq_advantages(rewards, group_ids=None, **args):
    """Run grpo on a one-token-per-sequence layout and read back the per-sequence advantages [N]."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    n = rewards.numel()
    group_ids = torch.zeros(n, dtype=torch.long) if group_ids is None else torch.as_tensor(group_ids)
    inputs = AdvantageInputs(rewards, group_ids, torch.ones(n, 1, dtype=torch.bool), torch.arange(n)[:, None])
    adv, metrics = grpo(inputs, **args)
    return adv[:, 0], metrics


def looped_reference(rewards, group_ids, std_normalize=True, epsilon=EPS):
    """docs/algorithms.md §4 written one group at a time, in float64."""
    out = [0.0] * len(rewards)
    for g in set(group_ids):
        members = [i for i, gi in enumerate(group_ids) if gi == g]
        values = [rewards[i] for i in members]
        if len(values) == 1:
            mu, sigma = 0.0, 1.0
        else:
            mu = sum(values) / len(values)
            sigma = math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - 1))
        for i in members:
            if len(values) > 1 and max(values) == min(values):
                out[i] = 0.0
            elif std_normalize:
                out[i] = (rewards[i] - mu) / (sigma + epsilon)
            else:
                out[i] = rewards[i] - mu
    return out


# §4 worked examples. R = [1, 0, 0, 0]: μ = 0.25, Σ(R − μ)² = 0.5625 + 3·0.0625 = 0.75, σ = sqrt(0.75/3) = 0.5.
# R = [0.5, 1, 0, 0.5]: μ = 0.5, σ = sqrt(0.5/3) = 0.4082483.
@pytest.mark.parametrize(
    ("rewards", "expected"),
    [
        ([1.0, 0.0, 0.0, 0.0], [0.75 / (0.5 + EPS)] + [-0.25 / (0.5 + EPS)] * 3),
        (
            [0.5, 1.0, 0.0, 0.5],
            [0.0, 0.5 / (math.sqrt(0.5 / 3) + EPS), -0.5 / (math.sqrt(0.5 / 3) + EPS), 0.0],
        ),
        ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_worked_examples(rewards, expected):
    adv, _ = seq_advantages(rewards)
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=1e-7)


def test_documented_rounded_values():
    adv, _ = seq_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv.tolist() == pytest.approx([1.499997, -0.499999, -0.499999, -0.499999], abs=1e-6)
    adv, _ = seq_advantages([0.5, 1.0, 0.0, 0.5])
    assert adv[1].item() == pytest.approx(1.224742, abs=1e-6)


def test_unbiased_std_not_population_std():
    # Population std sqrt(0.75/4) = 0.4330127 would give 0.75 / 0.4330127 = 1.732047.
    adv, _ = seq_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv[0].item() != pytest.approx(0.75 / math.sqrt(0.75 / 4), abs=1e-3)


def test_dr_grpo_example_without_std():
    # §5: R = [1, 0, 0, 0] ⇒ R − μ = [0.75, −0.25, −0.25, −0.25].
    adv, _ = seq_advantages([1.0, 0.0, 0.0, 0.0], std_normalize=False)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_group_of_one_uses_mu_0_sigma_1():
    adv, _ = seq_advantages([0.7, -2.0], group_ids=[3, 8])
    torch.testing.assert_close(adv, torch.tensor([0.7, -2.0]) / (1 + EPS))
    adv, _ = seq_advantages([0.7], std_normalize=False)
    assert adv.tolist() == pytest.approx([0.7])


def test_a_batch_of_groups_of_one_is_reported_and_warned_about_once(caplog, monkeypatch):
    # single-choice serve calls: no group baseline, so GRPO is REINFORCE with A = R; not silent
    import trivium.algorithm.advantage_parts as parts

    monkeypatch.setattr(parts, "_warned_single_groups", False)
    with caplog.at_level("WARNING", logger="trivium.algorithm.advantage_parts"):
        _, metrics = seq_advantages([1.0, 0.0, 0.5], group_ids=[4, 5, 6])
        seq_advantages([1.0, 0.0], group_ids=[7, 8])
    assert metrics["advantage/single_groups_fraction"] == 1.0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per process; the metric records every step
    assert "3 groups of one" in warnings[0] and "reinforceplusplus" in warnings[0] and "n >= 2" in warnings[0]
    _, metrics = seq_advantages([1.0, 0.0, 0.5], group_ids=[4, 4, 6])
    assert metrics["advantage/single_groups_fraction"] == 0.5


def test_all_equal_group_is_exactly_zero_even_when_the_mean_rounds():
    adv, metrics = seq_advantages([0.1, 0.1, 0.1, 0.3, 0.2], group_ids=[0, 0, 0, 1, 1])
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert metrics["advantage/zero_groups_fraction"] == 0.5


def test_interleaved_groups_do_not_mix():
    # The first two §4 examples, interleaved: sequence 2k is in group 5, sequence 2k+1 in group 2.
    a = [1.0, 0.0, 0.0, 0.0]
    b = [0.5, 1.0, 0.0, 0.5]
    rewards = [r for pair in zip(a, b) for r in pair]
    adv, metrics = seq_advantages(rewards, group_ids=[5, 2] * 4)
    torch.testing.assert_close(adv[0::2], seq_advantages(a)[0])
    torch.testing.assert_close(adv[1::2], seq_advantages(b)[0])
    assert metrics["advantage/num_groups"] == 2


@pytest.mark.parametrize("std_normalize", [True, False])
def test_vectorised_equals_looped_reference(std_normalize):
    gen = torch.Generator().manual_seed(1)
    group_ids = torch.randint(0, 9, (60,), generator=gen)  # random sizes, some groups of one or absent
    rewards = torch.randn(60, generator=gen)
    rewards[group_ids == 4] = 1.0  # one all-equal group
    rewards[group_ids == 6] = torch.randint(0, 2, ((group_ids == 6).sum(),), generator=gen).float()
    adv, _ = seq_advantages(rewards, group_ids, std_normalize=std_normalize)
    expected = looped_reference(rewards.double().tolist(), group_ids.tolist(), std_normalize=std_normalize)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-5)


def test_advantages_are_detached():
    rewards = torch.tensor([1.0, 0.0, 0.5], requires_grad=True)
    adv, _ = seq_advantages(rewards)
    assert not adv.requires_grad and adv.grad_fn is None


@pytest.mark.parametrize("pack_length", [None, 64], ids=["padded", "packed"])
def test_mask_puts_zero_on_prompt_padding_and_tool_tokens(make_batch, pack_length):
    batch = make_batch([[True, False, True], 1, 4], rewards=[1.0, 0.0, 0.0], pack_length=pack_length)
    adv, _ = ADVANTAGE_FNS.get("grpo")(AdvantageInputs.from_batch(batch))
    per_seq, _ = seq_advantages([1.0, 0.0, 0.0])
    expected = torch.where(batch.loss_mask, per_seq[batch.seq_index.clamp(min=0)], 0.0)
    torch.testing.assert_close(adv, expected)
    assert (adv[~batch.loss_mask] == 0).all() and (adv[batch.loss_mask] != 0).all()


def test_metrics_are_over_sequences():
    adv, metrics = seq_advantages([1.0, 0.0, 0.0, 0.0])
    assert metrics["advantage/mean"] == pytest.approx(float(adv.mean()), abs=1e-7)
    assert metrics["advantage/std"] == pytest.approx(float(adv.std()))
    assert metrics["advantage/zero_groups_fraction"] == 0.0


def test_unset_group_ids_are_refused():
    with pytest.raises(ValueError, match=r"group id >= 0, got \[-1\]"):
        seq_advantages([1.0, 0.0], group_ids=[-1, -1])


def test_input_shapes_are_checked():
    with pytest.raises(ValueError, match=r"\[N\]"):
        AdvantageInputs(
            torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.ones(3, 1).bool(), torch.zeros(3, 1)
        )
