"""Sequence-level advantages with a group baseline: RLOO, AsymRE, REINFORCE++-baseline.

Each compares a response's scalar reward R_i with the other samples of its prompt (its group), one
advantage per sequence, broadcast to its action tokens. They differ only in the baseline:

    rloo                        R_i − mean of the *other* samples            (G ≥ 2 required)
    asymre                      R_i − (μ_g + δ_V), δ_V < 0 favours positives  (no normalisation)
    reinforceplusplus_baseline  R_i − μ_g, then whitened over all valid tokens of the batch
    step_wise_grpo              G_{e,t} − μ_g over the group's *episodes*, / (σ_g + ε)  (multi-turn, one
                                sequence per model turn)

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

from trivium.algorithm.advantage_parts import (
    AdvantageInputs,
    all_equal_groups,
    as_float,
    broadcast_to_tokens,
    dense_groups,
    group_mean_std,
    group_normalise,
    group_reduce,
    sequence_metrics,
    valid_seq_index,
    whiten_on_mask,
)
from trivium.algorithm.registry import ADVANTAGE_FNS

__all__ = ["asymre", "reinforceplusplus_baseline", "rloo", "step_wise_grpo"]


@ADVANTAGE_FNS.register("rloo")
def rloo(inputs: AdvantageInputs, *, whiten: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Leave-one-out baseline (docs/algorithms.md §7): A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j = G/(G−1) (R_i − μ_g).

    Every group needs G ≥ 2. An all-equal group gets exactly 0. ``whiten`` standardises the per-sequence
    advantages over the batch, (A − mean) / sqrt(var + 1e-8) with the unbiased var, counting each
    response once and skipping responses without action tokens (they train on nothing). Returns ``[R, L]``.
    """
    rewards = as_float(inputs.rewards)
    group, counts = dense_groups(inputs.group_ids, "rloo")
    if (counts < 2).any():
        lonely = torch.unique(inputs.group_ids)[counts < 2].tolist()
        raise ValueError(
            f"rloo needs at least 2 samples per group (each sample's baseline is the mean of the others), "
            f"but group id(s) {lonely[:10]}{' ...' if len(lonely) > 10 else ''} have 1: sample each task "
            f"repeat_times >= 2, or use an advantage that works on single samples (reinforceplusplus, grpo)"
        )
    num_groups = counts.numel()
    total = group_reduce(rewards, group, num_groups, "sum")
    others = (total[group] - rewards) / (counts[group].to(rewards.dtype) - 1)
    seq_adv = torch.where(all_equal_groups(rewards, group, num_groups)[group], 0.0, rewards - others)
    metrics = sequence_metrics(seq_adv, group, counts)
    if whiten:
        seq = valid_seq_index(inputs.mask, inputs.seq_index, rewards.numel(), "rloo")
        has_tokens = torch.bincount(seq, minlength=rewards.numel()) > 0
        seq_adv = whiten_on_mask(seq_adv, has_tokens)
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics


@ADVANTAGE_FNS.register("asymre")
def asymre(inputs: AdvantageInputs, *, baseline_shift: float = -0.1) -> tuple[Tensor, dict[str, float]]:
    """Asymmetric REINFORCE (docs/algorithms.md §14): A_i = R_i − V_g with V_g = μ_g + δ_V (``baseline_shift``).

    δ_V < 0 puts the baseline below the group mean, so positives weigh more than negatives (the paper's
    stability condition is V below the behaviour policy's expected reward); δ_V = 0 is plain group-mean
    REINFORCE. An all-equal group therefore gets A = −δ_V, not 0: an SFT-like pull on every sample. A group
    of one uses V = 0 (A = R). No std normalisation. Returns ``[R, L]``.
    """
    rewards = as_float(inputs.rewards)
    group, counts = dense_groups(inputs.group_ids, "asymre")
    mean = group_reduce(rewards, group, counts.numel(), "sum") / counts.to(rewards.dtype)
    baseline = torch.where(counts == 1, 0.0, mean + baseline_shift)
    seq_adv = rewards - baseline[group]
    metrics = sequence_metrics(seq_adv, group, counts)
    metrics["advantage/baseline_mean"] = float(baseline.mean())
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics


@ADVANTAGE_FNS.register("reinforceplusplus_baseline")
def reinforceplusplus_baseline(inputs: AdvantageInputs) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++-baseline (docs/algorithms.md §8): Ã_i = R_i − μ_g, broadcast to tokens, whitened globally.

    The whitening runs over all valid tokens of the batch, (x − mean) / sqrt(var + 1e-8) with the
    unbiased var, so long responses weigh more in the statistics; group std is not used (the global std
    replaces it, which keeps hard and easy prompts on one scale). Group conventions are grpo's: a group
    of one gets Ã = R (no baseline, like REINFORCE++), an all-equal group exactly 0 before whitening.
    The KL term goes in the loss (§2.1b), not in the rewards. Returns ``[R, L]``.
    """
    rewards = as_float(inputs.rewards)
    group, counts = dense_groups(inputs.group_ids, "reinforceplusplus_baseline")
    seq_adv = group_normalise(rewards, group, counts, std_normalize=False, epsilon=0.0)
    tokens = broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index)
    return whiten_on_mask(tokens, inputs.mask), sequence_metrics(seq_adv, group, counts)


@ADVANTAGE_FNS.register("step_wise_grpo")
def step_wise_grpo(
    inputs: AdvantageInputs, *, std_normalize: bool = True, epsilon: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """GRPO for step-wise multi-turn experiences: one sequence per model turn, compared across *episodes*.

    A group holds the episodes (runs) of one task; ``run_ids`` tell the episodes apart and ``turns`` the
    model turns inside one. Each sequence's reward is the return from its turn on, G_{e,t} (the episode
    reward on every turn when the environment rewards only the end). The episode return is G_e = G_{e,t0}
    at the episode's first turn present. Then, with μ_g and the unbiased σ_g over the group's episode
    returns (each episode counted once, however many turns it took):

        A_{e,t} = (G_{e,t} − μ_g) / (σ_g + ε)        (G_{e,t} − μ_g without std normalisation)

    so a long episode does not weigh more in the baseline than a short one. With final rewards only this
    is GRPO's advantage of the episode, given to every one of its turns. Conventions as GRPO: a group of
    one episode uses μ = 0, σ = 1; a group whose episode returns are all equal gets 0 on every turn.
    """
    if inputs.run_ids is None or inputs.turns is None:
        raise ValueError(
            "step_wise_grpo needs inputs.run_ids and inputs.turns (Experience.run_index and .turn, filled "
            "by collate); build AdvantageInputs with AdvantageInputs.from_batch(batch)"
        )
    rewards = as_float(inputs.rewards)
    group, _ = dense_groups(inputs.group_ids, "step_wise_grpo")
    # Dense episode id of every sequence: one per distinct (group, run).
    pairs = torch.stack([group, inputs.run_ids.to(group.device)], dim=1)
    _, episode = torch.unique(pairs, dim=0, return_inverse=True)
    num_episodes = int(episode.max()) + 1 if episode.numel() else 0
    turns = inputs.turns.to(group.device)
    first_turn = group_reduce(turns.to(rewards.dtype), episode, num_episodes, "amin")
    is_first = turns.to(rewards.dtype) == first_turn[episode]
    # The first-turn sequence of each episode (the lowest index if a turn appears twice).
    index = torch.arange(rewards.numel(), device=rewards.device, dtype=rewards.dtype)
    candidate = torch.where(is_first, index, torch.full_like(index, float(rewards.numel())))
    first_seq = group_reduce(candidate, episode, num_episodes, "amin").long()
    episode_return = rewards[first_seq]
    episode_group = group[first_seq]
    _, episode_group, episode_counts = torch.unique(episode_group, return_inverse=True, return_counts=True)
    seq_group = episode_group[episode]  # dense over groups that have episodes (all of them)
    mean, std = group_mean_std(episode_return, episode_group, episode_counts)
    centred = rewards - mean[seq_group]
    seq_adv = centred / (std[seq_group] + epsilon) if std_normalize else centred
    all_equal = all_equal_groups(episode_return, episode_group, episode_counts.numel()) & (episode_counts > 1)
    seq_adv = torch.where(all_equal[seq_group], 0.0, seq_adv)
    metrics = sequence_metrics(seq_adv, seq_group, episode_counts)
    metrics["advantage/episodes"] = float(num_episodes)
    metrics["advantage/turns_per_episode"] = rewards.numel() / max(num_episodes, 1)
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics
