"""Advantage functions: rewards (and optional per-token inputs) in, per-token advantages ``[R, L]`` out.

Every function has one signature, ``fn(inputs: AdvantageInputs, **args) -> (advantages [R, L], metrics)``,
and is registered in ``ADVANTAGE_FNS``. This file holds the inputs type, the group-baseline core shared
by several estimators, and GRPO / Dr. GRPO / REC. Other families live next to it and register on import
(see the end of this file): ``advantages_group`` (RLOO, AsymRE, REINFORCE++-baseline),
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

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.algorithm.registry import ADVANTAGE_FNS
from trivium.types import TrainBatch

__all__ = ["AdvantageInputs", "broadcast_to_tokens", "grpo", "rec"]


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage function may look at; ``N`` sequences laid out in ``R`` rows of length ``L``."""

    rewards: Tensor  # [N] float: one scalar reward per sequence (KL penalty included when it is on)
    group_ids: Tensor  # [N] int64: sequences compared with each other (the samples of one prompt)
    mask: Tensor  # [R, L] bool: True on action tokens we train on
    seq_index: Tensor  # [R, L] int64: sequence id 0..N-1 of each token, -1 on padding
    # Optional inputs, present when the algorithm needs them (the trainer fills what the preset asks for):
    token_rewards: Tensor | None = None  # [R, L]: per-token rewards rw (R_i on the last action token,
    #                                      minus the KL penalty on every action token); sums to ``rewards``
    values: Tensor | None = None  # [R, L]: critic values V^old of each action token's state
    old_logprobs: Tensor | None = None  # [R, L]: ℓold, behaviour policy
    ref_logprobs: Tensor | None = None  # [R, L]: ℓref, reference model
    teacher_logprobs: Tensor | None = None  # [R, L]: ℓT, teacher's log-prob of the sampled token
    run_ids: Tensor | None = None  # [N] int64: episode of each sequence within its group (step-wise)
    turns: Tensor | None = None  # [N] int64: model turn of each sequence within its episode (step-wise)

    def __post_init__(self) -> None:
        n = self.rewards.shape
        if self.rewards.dim() != 1 or self.group_ids.shape != n:
            raise ValueError(
                f"rewards and group_ids must both be [N], got {tuple(n)} and {tuple(self.group_ids.shape)}"
            )
        if self.mask.shape != self.seq_index.shape or self.mask.dtype != torch.bool:
            raise ValueError(
                f"mask (bool) and seq_index must share one [R, L] shape, got mask {tuple(self.mask.shape)} "
                f"{self.mask.dtype} and seq_index {tuple(self.seq_index.shape)}"
            )

    @classmethod
    def from_batch(cls, batch: TrainBatch) -> AdvantageInputs:
        return cls(
            batch.rewards,
            batch.group_ids,
            batch.loss_mask,
            batch.seq_index,
            run_ids=batch.run_ids,
            turns=batch.turns,
        )


def broadcast_to_tokens(values: Tensor, mask: Tensor, seq_index: Tensor) -> Tensor:
    """Per-sequence ``values [N]`` to per-token ``[R, L]``: each token gets its sequence's value, 0 off mask."""
    return torch.where(mask, values[seq_index.clamp(min=0)], 0.0)


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
    rewards = _as_float(inputs.rewards)
    group, counts = _dense_groups(inputs.group_ids, who)
    seq_adv = _group_normalise(rewards, group, counts, std_normalize=std_normalize, epsilon=epsilon)
    advantages = broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index)
    return advantages, _sequence_metrics(seq_adv, group, counts)


# The estimators whose baseline is the group's (a group of one has none): what check-config names for
# traffic that comes in groups of one (serve mode). A new group-relative estimator adds its name here.
GROUP_BASELINE_FNS = ("grpo", "rec", "rloo", "asymre", "reinforceplusplus_baseline", "step_wise_grpo")


# Helpers shared by the advantage modules of this package (advantages_*.py).


def _as_float(values: Tensor) -> Tensor:
    """Detached, in float32 at least (a bf16 reward or log-prob would round group statistics)."""
    return values.detach().to(torch.promote_types(values.dtype, torch.float32))


def _require(inputs: AdvantageInputs, name: str, who: str, provider: str) -> Tensor:
    """The optional per-token input ``inputs.<name>`` detached, or a ValueError saying what provides it."""
    value = getattr(inputs, name)
    if value is None:
        raise ValueError(f"{who} needs inputs.{name}: {provider}")
    if value.shape != inputs.mask.shape:
        raise ValueError(
            f"{who}: inputs.{name} must have the mask's [R, L] shape {tuple(inputs.mask.shape)}, "
            f"got {tuple(value.shape)}"
        )
    return _as_float(value)


def _valid_seq_index(mask: Tensor, seq_index: Tensor, num_seqs: int, who: str) -> Tensor:
    """Sequence id ``[K]`` of each token on ``mask`` (row-major order), checked to lie in [0, N)."""
    seq = seq_index[mask]
    if seq.numel() and (int(seq.min()) < 0 or int(seq.max()) >= num_seqs):
        raise ValueError(
            f"{who}: seq_index on the mask must be in [0, N={num_seqs}) (every action token belongs to one "
            f"of the N sequences), got values in [{int(seq.min())}, {int(seq.max())}]"
        )
    return seq


def _dense_groups(group_ids: Tensor, who: str) -> tuple[Tensor, Tensor]:
    """Dense group index ``[N]`` (0..G-1) and group sizes ``[G]``; refuses unset (negative) ids."""
    if (group_ids < 0).any():
        bad = group_ids[group_ids < 0].unique().tolist()
        raise ValueError(
            f"{who} needs every group id >= 0, got {bad}: -1 is Experience.group_id's 'unset' value; set "
            f"group ids in the workflow (the samples of one task share one id)"
        )
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return group, counts


def _group_normalise(
    rewards: Tensor, group: Tensor, counts: Tensor, *, std_normalize: bool, epsilon: float
) -> Tensor:
    """``rewards [N]`` with dense group ids ``group [N]`` (0..G-1) and sizes ``counts [G]`` -> A ``[N]``."""
    num_groups = counts.numel()
    mean, std = _group_mean_std(rewards, group, counts)
    centred = rewards - mean[group]
    adv = centred / (std[group] + epsilon) if std_normalize else centred
    all_equal = _all_equal_groups(rewards, group, num_groups) & (counts > 1)
    return torch.where(all_equal[group], 0.0, adv)


def _group_mean_std(rewards: Tensor, group: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group mean and unbiased std ``[G]``; a group of one gets μ = 0, σ = 1 (docs/algorithms.md §4)."""
    num_groups = counts.numel()
    sizes = counts.to(rewards.dtype)
    mean = _group_reduce(rewards, group, num_groups, "sum") / sizes
    sq_dev = (rewards - mean[group]) ** 2
    std = (_group_reduce(sq_dev, group, num_groups, "sum") / (sizes - 1).clamp(min=1)).sqrt()
    single = counts == 1
    return torch.where(single, 0.0, mean), torch.where(single, 1.0, std)


def _all_equal_groups(rewards: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """``[G]`` bool: the group's rewards are all exactly equal (always true for a group of one)."""
    highest = _group_reduce(rewards, group, num_groups, "amax")
    return highest == _group_reduce(rewards, group, num_groups, "amin")


def _group_reduce(values: Tensor, group: Tensor, num_groups: int, reduce: str) -> Tensor:
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, group, values, reduce=reduce, include_self=False)


def _sequence_metrics(seq_adv: Tensor, group: Tensor, counts: Tensor) -> dict[str, float]:
    group_abs_max = _group_reduce(seq_adv.abs(), group, counts.numel(), "amax")
    single = float((counts == 1).float().mean())
    if single == 1.0 and counts.numel() > 1:
        _warn_single_groups_once(counts.numel())
    return {
        "advantage/mean": float(seq_adv.mean()),
        "advantage/std": float(seq_adv.std()) if seq_adv.numel() > 1 else 0.0,
        "advantage/zero_groups_fraction": float((group_abs_max == 0).float().mean()),
        "advantage/single_groups_fraction": single,
        "advantage/num_groups": float(counts.numel()),
    }


_warned_single_groups = False


def _warn_single_groups_once(num_groups: int) -> None:
    """A batch of groups of one (single-choice serve calls, explorer.repeat_times 1) has no group to
    compare within: say so once per process; ``advantage/single_groups_fraction`` records every step."""
    global _warned_single_groups
    if _warned_single_groups:
        return
    _warned_single_groups = True
    logging.getLogger(__name__).warning(
        "a group-relative advantage got %d groups of one experience each (single-choice serve calls, or "
        "explorer.repeat_times: 1): there is no group baseline, so each advantage is its bare reward (GRPO: "
        "A = R), REINFORCE without a baseline, which reinforces every reply when rewards are positive. Ask "
        "for n >= 2 choices per call and reward each, raise repeat_times, or use algorithm_type: "
        "reinforceplusplus (a batch-wide baseline). advantage/single_groups_fraction records it every step",
        num_groups,
    )


def _whiten(values: Tensor, mask: Tensor, epsilon: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + ε) over the tokens on ``mask`` only (unbiased var); 0 off the mask.

    One valid token (or all equal) has var 0 and comes out as exactly 0.
    """
    n = mask.sum()
    kept = torch.where(mask, values, 0.0)  # also drops NaN/inf that may sit off the mask
    mean = kept.sum() / n.clamp(min=1)
    var = torch.where(mask, (values - mean) ** 2, 0.0).sum() / (n - 1).clamp(min=1)
    return torch.where(mask, (values - mean) * torch.rsqrt(var + epsilon), 0.0)


def _token_stats(values: Tensor, mask: Tensor) -> tuple[float, float]:
    """Mean and (unbiased) std of ``values`` over the tokens on ``mask``, for metrics."""
    kept = values[mask]
    if kept.numel() == 0:
        return 0.0, 0.0
    return float(kept.mean()), (float(kept.std()) if kept.numel() > 1 else 0.0)
