"""Sequence-level advantages with a group baseline: RLOO, AsymRE, REINFORCE++-baseline.

Each compares a response's scalar reward R_i with the other samples of its prompt (its group), one
advantage per sequence, broadcast to its action tokens. They differ only in the baseline:

    rloo                        R_i − mean of the *other* samples            (G ≥ 2 required)
    asymre                      R_i − (μ_g + δ_V), δ_V < 0 favours positives  (no normalisation)
    reinforceplusplus_baseline  R_i − μ_g, then whitened over all valid tokens of the batch
    step_wise_grpo              G_{e,t} − μ_g over the group's *episodes*, / (σ_g + ε)  (multi-turn, one
                                sequence per model turn)
    gigpo                       the episode's advantage plus a step-level one over the turns that started
                                from the same environment state (step-wise)

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

from dataclasses import dataclass

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

__all__ = ["asymre", "gigpo", "reinforceplusplus_baseline", "rloo", "step_wise_grpo"]


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
    inputs: AdvantageInputs, *, std_normalize: bool = True, epsilon: float = 1e-6, positive_scale: float = 1.0
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

    ``positive_scale`` α multiplies the positive advantages (R3L's positive amplification, docs/algorithms.md
    §25: with the ``reflect_retry`` workflow the few successful retries weigh more against the many
    failures); 1 leaves them as they are.
    """
    if not positive_scale > 0:
        raise ValueError(
            f"step_wise_grpo needs positive_scale > 0 (the factor on positive advantages), got {positive_scale}"
        )
    rewards = as_float(inputs.rewards)
    ep = _episodes(inputs, rewards, "step_wise_grpo")
    centred = rewards - ep.mean[ep.seq_group]
    seq_adv = centred / (ep.std[ep.seq_group] + epsilon) if std_normalize else centred
    seq_adv = torch.where(ep.all_equal[ep.seq_group], 0.0, seq_adv)
    if positive_scale != 1.0:
        seq_adv = torch.where(seq_adv > 0, positive_scale * seq_adv, seq_adv)
    metrics = sequence_metrics(seq_adv, ep.seq_group, ep.counts)
    metrics["advantage/episodes"] = float(ep.num_episodes)
    metrics["advantage/turns_per_episode"] = rewards.numel() / max(ep.num_episodes, 1)
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics


@ADVANTAGE_FNS.register("gigpo")
def gigpo(
    inputs: AdvantageInputs, *, step_weight: float = 1.0, std_normalize: bool = True, epsilon: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """GiGPO (Feng et al. 2025, arXiv:2505.10978; docs/algorithms.md §24): group-in-group credit for agents.

    Step-wise experiences (one sequence per model turn, ``workflow: step_wise``). Two relative advantages:

        episode level  A^E_e   = (G_e − μ_g) / (σ_g + ε)  over the group's episode returns (as step_wise_grpo,
                                 every turn of an episode gets its episode's);
        step level     A^S_e,t = (G_e,t − μ_s) / (σ_s + ε) over the turns of the group that started from the
                                 same environment state s (``states``: the workflow's ``info["state"]``),
                                 G_e,t the return from the turn on (discounted by the workflow's ``discount``);

    and A = A^E + ω·A^S with ω = ``step_weight``. A state reached once in the group, or whose turns all have
    one return, gives A^S = 0, so with no repeated states this is step_wise_grpo with the episode's return.
    Turns from one state are the paper's anchor-state groups: the same situation, different moves, so the
    return difference is the move's. Without std normalisation both levels are centred only.
    """
    if inputs.states is None or not bool((inputs.states >= 0).any()):
        raise ValueError(
            "gigpo needs the environment state each turn started from (Experience.info['state']), which the "
            "step_wise workflow records: use `workflow: step_wise` for the taskset, or algorithm_type "
            "grpo / step_wise_grpo for one experience per episode"
        )
    if not step_weight >= 0:
        raise ValueError(
            f"gigpo needs step_weight >= 0 (ω, the weight of the step-level advantage), got {step_weight}"
        )
    rewards = as_float(inputs.rewards)
    ep = _episodes(inputs, rewards, "gigpo")
    g = ep.episode_return[ep.episode]  # each turn's episode return
    denominator = (ep.std[ep.seq_group] + epsilon) if std_normalize else 1.0
    episode_adv = torch.where(ep.all_equal[ep.seq_group], 0.0, (g - ep.mean[ep.seq_group]) / denominator)
    # Anchor-state groups: turns of one task group that started from one state.
    states = inputs.states.to(ep.seq_group.device)
    known = states >= 0
    pairs = torch.stack(
        [ep.seq_group, torch.where(known, states, -1 - torch.arange(states.numel(), device=states.device))],
        dim=1,
    )
    _, step_group, step_counts = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
    step_mean, step_std = group_mean_std(rewards, step_group, step_counts)
    flat = all_equal_groups(rewards, step_group, step_counts.numel())  # includes groups of one
    step_denominator = (step_std[step_group] + epsilon) if std_normalize else 1.0
    step_adv = torch.where(flat[step_group], 0.0, (rewards - step_mean[step_group]) / step_denominator)
    seq_adv = episode_adv + step_weight * step_adv
    metrics = sequence_metrics(seq_adv, ep.seq_group, ep.counts)
    shared = (step_counts[step_group] > 1) & known
    metrics.update(
        {
            "advantage/episodes": float(ep.num_episodes),
            "advantage/turns_per_episode": rewards.numel() / max(ep.num_episodes, 1),
            "gigpo/anchor_groups": float(int((step_counts > 1).sum())),
            "gigpo/turns_in_anchor_groups": float(shared.float().mean()),
            "gigpo/step_advantage_nonzero": float((step_adv != 0).float().mean()),
            "gigpo/step_advantage_abs_mean": float(step_adv.abs().mean()),
        }
    )
    return broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index), metrics


@dataclass(frozen=True)
class _Episodes:
    """The episodes of a step-wise batch: which episode each sequence is, and the group statistics of the
    episode returns (each episode counted once, however many turns it took)."""

    episode: Tensor  # [N] dense episode id of each sequence
    num_episodes: int
    episode_return: Tensor  # [E] G_e: the return of the episode's first turn present
    seq_group: Tensor  # [N] dense group id over groups that have episodes
    counts: Tensor  # [G] episodes per group
    mean: Tensor  # [G] μ_g of the episode returns (0 for a group of one)
    std: Tensor  # [G] unbiased σ_g (1 for a group of one)
    all_equal: Tensor  # [G] bool: a group of 2+ episodes whose returns are all equal


def _episodes(inputs: AdvantageInputs, rewards: Tensor, name: str) -> _Episodes:
    if inputs.run_ids is None or inputs.turns is None:
        raise ValueError(
            f"{name} needs inputs.run_ids and inputs.turns (Experience.run_index and .turn, filled "
            "by collate); build AdvantageInputs with AdvantageInputs.from_batch(batch)"
        )
    group, _ = dense_groups(inputs.group_ids, name)
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
    _, episode_group, counts = torch.unique(group[first_seq], return_inverse=True, return_counts=True)
    mean, std = group_mean_std(episode_return, episode_group, counts)
    all_equal = all_equal_groups(episode_return, episode_group, counts.numel()) & (counts > 1)
    return _Episodes(
        episode, num_episodes, episode_return, episode_group[episode], counts, mean, std, all_equal
    )
