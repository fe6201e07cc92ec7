"""Advantage functions: per-sequence rewards ``[N]`` in, per-token advantages ``[R, L]`` out.

Design decisions:
- Advantages carry no gradient (ALGORITHMS.md §0.1): rewards are detached on entry, whatever the caller
  passes, so a reward model's graph can never leak into the policy loss.
- Group statistics are computed for all groups at once (``torch.unique`` + ``index_add_``), with no Python
  loop over groups; ``tests/algorithm`` checks them against a looped reference.
- Tokens get their sequence's advantage through ``seq_index``, so padded and packed rows are the same.

Left out: critic-based estimators (GAE) and leave-one-out baselines; they register here when they land.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.algorithm.registry import ADVANTAGE_FNS
from trivium.types import TrainBatch

__all__ = ["AdvantageInputs", "broadcast_to_tokens", "grpo"]


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
        return cls(batch.rewards, batch.group_ids, batch.loss_mask, batch.seq_index)


def broadcast_to_tokens(values: Tensor, mask: Tensor, seq_index: Tensor) -> Tensor:
    """Per-sequence ``values [N]`` to per-token ``[R, L]``: each token gets its sequence's value, 0 off mask."""
    return torch.where(mask, values[seq_index.clamp(min=0)], 0.0)


@ADVANTAGE_FNS.register("grpo")
def grpo(
    inputs: AdvantageInputs, *, std_normalize: bool = True, epsilon: float = 1e-6
) -> tuple[Tensor, dict[str, float]]:
    """Group-normalised advantage (ALGORITHMS.md §4; ``std_normalize=False`` is Dr. GRPO, §5).

    A_i = (R_i − μ_g) / (σ_g + ε) with the unbiased std σ_g of the group; R_i − μ_g without std.
    A group of one uses μ = 0, σ = 1 (A = R/(1 + ε)); a group whose rewards are all equal gets exactly 0
    (rounding in μ would otherwise leave ~1e-8 / ε of noise). Returns advantages ``[R, L]`` (detached,
    0 off the mask) and metrics over the N sequences.
    """
    if (inputs.group_ids < 0).any():
        bad = inputs.group_ids[inputs.group_ids < 0].unique().tolist()
        raise ValueError(
            f"grpo needs every group id >= 0, got {bad}: -1 is Experience.group_id's 'unset' value; set "
            f"group ids in the workflow (the samples of one task share one id)"
        )
    rewards = inputs.rewards.detach().to(torch.promote_types(inputs.rewards.dtype, torch.float32))
    _, group, counts = torch.unique(inputs.group_ids, return_inverse=True, return_counts=True)
    seq_adv = _group_normalise(rewards, group, counts, std_normalize=std_normalize, epsilon=epsilon)
    advantages = broadcast_to_tokens(seq_adv, inputs.mask, inputs.seq_index)
    group_abs_max = _group_reduce(seq_adv.abs(), group, counts.numel(), "amax")
    metrics = {
        "advantage/mean": float(seq_adv.mean()),
        "advantage/std": float(seq_adv.std()) if seq_adv.numel() > 1 else 0.0,
        "advantage/zero_groups_fraction": float((group_abs_max == 0).float().mean()),
        "advantage/num_groups": float(counts.numel()),
    }
    return advantages, metrics


def _group_normalise(
    rewards: Tensor, group: Tensor, counts: Tensor, *, std_normalize: bool, epsilon: float
) -> Tensor:
    """``rewards [N]`` with dense group ids ``group [N]`` (0..G-1) and sizes ``counts [G]`` -> A ``[N]``."""
    num_groups = counts.numel()
    sizes = counts.to(rewards.dtype)
    mean = _group_reduce(rewards, group, num_groups, "sum") / sizes
    sq_dev = (rewards - mean[group]) ** 2
    std = (_group_reduce(sq_dev, group, num_groups, "sum") / (sizes - 1).clamp(min=1)).sqrt()
    single = counts == 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, std)
    centred = rewards - mean[group]
    adv = centred / (std[group] + epsilon) if std_normalize else centred
    highest = _group_reduce(rewards, group, num_groups, "amax")
    all_equal = (highest == _group_reduce(rewards, group, num_groups, "amin")) & ~single
    return torch.where(all_equal[group], 0.0, adv)


def _group_reduce(values: Tensor, group: Tensor, num_groups: int, reduce: str) -> Tensor:
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, group, values, reduce=reduce, include_self=False)
