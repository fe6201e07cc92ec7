"""Sequence-level advantages with a group baseline: RLOO, AsymRE, REINFORCE++-baseline.

Each compares a response's scalar reward R_i with the other samples of its prompt (its group), one
advantage per sequence, broadcast to its action tokens. They differ only in the baseline:

    rloo                        R_i − mean of the *other* samples            (G ≥ 2 required)
    asymre                      R_i − (μ_g + δ_V), δ_V < 0 favours positives  (no normalisation)
    reinforceplusplus_baseline  R_i − μ_g, then whitened over all valid tokens of the batch

Design decisions:
- The group statistics are grpo's (``advantages._group_normalise`` and friends): one vectorised
  implementation of "group mean" for the whole library; no Python loop over groups.
- ``rewards`` are taken as given: when the KL penalty is on, the trainer has already subtracted
  β Σ_t k from them (``rewards_shaping.kl_penalty_token_rewards`` summed per sequence).
- Metrics (``advantage/mean``, ``std``, ...) describe the per-sequence advantages *before* any whitening;
  after whitening mean and std are 0 and 1 by construction and say nothing.

Left out: RLOO's sequence-level importance ratio (a policy-loss choice, not an advantage).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trivium.algorithm.advantages import (
    AdvantageInputs,
    _all_equal_groups,
    _as_float,
    _dense_groups,
    _group_normalise,
    _group_reduce,
    _sequence_metrics,
    _valid_seq_index,
    _whiten,
    broadcast_to_tokens,
)
from trivium.algorithm.registry import ADVANTAGE_FNS

__all__ = ["asymre", "reinforceplusplus_baseline", "rloo"]


@ADVANTAGE_FNS.register("rloo")
def rloo(inputs: AdvantageInputs, *, whiten: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Leave-one-out baseline (ALGORITHMS.md §7): A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j = G/(G−1) (R_i − μ_g).

    Every group needs G ≥ 2. An all-equal group gets exactly 0. ``whiten`` standardises the per-sequence
    advantages over the batch, (A − mean) / sqrt(var + 1e-8) with the unbiased var, counting each
    response once and skipping responses without action tokens (they train on nothing). Returns ``[R, L]``.
    """
    rewards = _as_float(inputs.rewards)
    group, counts = _dense_groups(inputs.group_ids, "rloo")
    if (counts < 2).any():
        lonely = torch.unique(inputs.group_ids)[counts < 2].tolist()
        raise ValueError(
            f"rloo needs at least 2 samples per group (each sample's baseline is the mean of the others), "
            f"but group id(s) {lonely[:10]}{' ...' if len(lonely) > 10 else ''} have 1: sample each task "
            f"repeat_times >= 2, or use an advantage that works on single samples (reinforceplusplus, grpo)"
        )
    num_groups = counts.numel()
    total = _group_reduce(rewards, group, num_groups, "sum")
    others = (total[group] - rewards) / (counts[group].to(rewards.dtype) - 1)
    seq_adv = torch.where(_all_equal_groups(rewards, group, num_groups)[group], 0.0, rewards - others)
    metrics = _sequence_metrics(seq_adv, group, counts)
    if whiten:
        seq = _valid_seq_index(inputs.mask, inputs.seq_index, rewards.numel(), "rloo")
        has_tokens = torch.bincount(seq, minlength=rewards.numel()) > 0
        seq_adv = _whiten(seq_adv, has_tokens)
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics


@ADVANTAGE_FNS.register("asymre")
def asymre(inputs: AdvantageInputs, *, baseline_shift: float = -0.1) -> tuple[Tensor, dict[str, float]]:
    """Asymmetric REINFORCE (ALGORITHMS.md §14): A_i = R_i − V_g with V_g = μ_g + δ_V (``baseline_shift``).

    δ_V < 0 puts the baseline below the group mean, so positives weigh more than negatives (the paper's
    stability condition is V below the behaviour policy's expected reward); δ_V = 0 is plain group-mean
    REINFORCE. An all-equal group therefore gets A = −δ_V, not 0: an SFT-like pull on every sample. A group
    of one uses V = 0 (A = R). No std normalisation. Returns ``[R, L]``.
    """
    rewards = _as_float(inputs.rewards)
    group, counts = _dense_groups(inputs.group_ids, "asymre")
    mean = _group_reduce(rewards, group, counts.numel(), "sum") / counts.to(rewards.dtype)
    baseline = torch.where(counts == 1, 0.0, mean + baseline_shift)
    seq_adv = rewards - baseline[group]
    metrics = _sequence_metrics(seq_adv, group, counts)
    metrics["advantage/baseline_mean"] = float(baseline.mean())
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics


@ADVANTAGE_FNS.register("reinforceplusplus_baseline")
def reinforceplusplus_baseline(inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++-baseline (ALGORITHMS.md §8): Ã_i = R_i − μ_g, broadcast to tokens, whitened globally.

    The whitening runs over all valid tokens of the batch, (x − mean) / sqrt(var + 1e-8) with the
    unbiased var, so long responses weigh more in the statistics; group std is not used (the global std
    replaces it, which keeps hard and easy prompts on one scale). Group conventions are grpo's: a group
    of one gets Ã = R (no baseline, like REINFORCE++), an all-equal group exactly 0 before whitening.
    The KL term goes in the loss (§2.1b), not in the rewards. Returns ``[R, L]``.
    """
    rewards = _as_float(inputs.rewards)
    group, counts = _dense_groups(inputs.group_ids, "reinforceplusplus_baseline")
    seq_adv = _group_normalise(rewards, group, counts, std_normalize=False, epsilon=0.0)
    tokens = broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index)
    return _whiten(tokens, inputs.mask), _sequence_metrics(seq_adv, group, counts)
