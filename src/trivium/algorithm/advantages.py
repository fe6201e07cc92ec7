"""Advantage functions: rewards (and optional per-token inputs) in, per-token advantages ``[R, L]`` out.

Every function has one signature, ``fn(inputs: AdvantageInputs, **args) -> (advantages [R, L], metrics)``,
and is registered in ``ADVANTAGE_FNS``. This file holds the group-baseline core and GRPO / Dr. GRPO / REC;
the inputs type and the helpers every estimator shares are in ``advantage_parts``. Other families live next
to it (the registry loads them on first use): ``advantages_group`` (RLOO, AsymRE, REINFORCE++-baseline),
``advantages_returns`` (REINFORCE++: returns-to-go of token rewards), ``advantages_critic`` (GAE, and the
critic's value targets) and ``advantages_distill`` (on-policy and JSD distillation). ``rewards_shaping``
builds the token rewards and holds the KL-penalty controllers and DAPO's shaping.

Design decisions:
- Advantages carry no gradient (docs/algorithms.md §0.1): every input is detached on entry, whatever the caller
  passes, so a reward model's graph can never leak into the policy loss.
- Group statistics are computed for all groups at once (``torch.unique`` + ``scatter_reduce``), with no
  Python loop over groups; ``tests/algorithm`` checks them against looped references.
- Tokens get their sequence's advantage through ``seq_index``, so padded and packed rows are the same.
- Statistics over tokens (whitening) use only tokens on the mask: prompt, padding and tool tokens never
  shift a mean or a variance (docs/algorithms.md §22.4).
- A function that needs an optional input which is ``None`` raises, naming the input and what provides it.
"""

from __future__ import annotations

from torch import Tensor

from trivium.algorithm.advantage_parts import (
    AdvantageInputs,
    as_float,
    broadcast_to_tokens,
    dense_groups,
    group_normalise,
    sequence_metrics,
)
from trivium.algorithm.registry import ADVANTAGE_FNS

__all__ = ["AdvantageInputs", "broadcast_to_tokens", "grpo", "rec"]


@ADVANTAGE_FNS.register("grpo")
def grpo(
    inputs: AdvantageInputs, *, std_normalize: bool = True, epsilon: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """Group-normalised advantage (docs/algorithms.md §4; ``std_normalize=False`` is Dr. GRPO, §5).

    A_i = (R_i − μ_g) / (σ_g + ε) with the unbiased std σ_g of the group; R_i − μ_g without std.
    A group of one uses μ = 0, σ = 1 (A = R/(1 + ε)); a group whose rewards are all equal gets exactly 0
    (rounding in μ would otherwise leave ~1e-8 / ε of noise). Returns advantages ``[R, L]`` (detached,
    0 off the mask) and metrics over the N sequences.
    """
    return _group_baseline_advantages(inputs, "grpo", std_normalize=std_normalize, epsilon=epsilon)


@ADVANTAGE_FNS.register("rec")
def rec(
    inputs: AdvantageInputs, *, std_normalize: bool = False, epsilon: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """REC's group-relative REINFORCE advantage (docs/algorithms.md §15): A_i = R_i − μ_g, optionally /(σ_g + ε).

    The same estimator as ``grpo`` with the other default: REC's claim is that the group-mean baseline
    alone is what makes group-relative REINFORCE work off-policy; the std division is optional. The
    conventions of ``grpo`` hold (a group of one gets A = R, an all-equal group exactly 0).
    """
    return _group_baseline_advantages(inputs, "rec", std_normalize=std_normalize, epsilon=epsilon)


def _group_baseline_advantages(
    inputs: AdvantageInputs, who: str, *, std_normalize: bool, epsilon: float
) -> tuple[Tensor, dict[str, float]]:
    rewards = as_float(inputs.rewards)
    group, counts = dense_groups(inputs.group_ids, who)
    seq_adv = group_normalise(rewards, group, counts, std_normalize=std_normalize, epsilon=epsilon)
    advantages = broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index)
    return advantages, sequence_metrics(seq_adv, group, counts)


# The estimators whose baseline is the group's (a group of one has none): what check-config names for
# traffic that comes in groups of one (serve mode). A new group-relative estimator adds its name here.
GROUP_BASELINE_FNS = (
    "grpo",
    "rec",
    "rloo",
    "asymre",
    "reinforceplusplus_baseline",
    "step_wise_grpo",
    "gigpo",
)
