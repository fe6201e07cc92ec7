"""The parts every advantage function is built from: its inputs, and the helpers the estimators share.

``AdvantageInputs`` is what an advantage function may look at (``advantages.py`` states the one signature
all of them have). The helpers below are the shared arithmetic of the estimator families
(``advantages*.py``) and of ``rewards_shaping.py``: group statistics over all groups at once
(``torch.unique`` + ``scatter_reduce``, no Python loop over groups), whitening and statistics over the
tokens on the mask only, the sequence grid that the returns-to-go recursions run on, and the checks that
name a missing or malformed input. A new estimator imports them from here; nothing here registers anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.types import TrainBatch

__all__ = [
    "AdvantageInputs",
    "SequenceGrid",
    "all_equal_groups",
    "as_float",
    "broadcast_to_tokens",
    "check_unit",
    "dense_groups",
    "discounted_reverse_cumsum",
    "group_mean_std",
    "group_normalise",
    "group_reduce",
    "require_input",
    "sequence_metrics",
    "token_stats",
    "valid_seq_index",
    "whiten_on_mask",
]


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
    states: Tensor | None = (
        None  # [N] int64: environment state each turn started from, -1 unknown (step-wise)
    )

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
            states=batch.states,
        )


def broadcast_to_tokens(values: Tensor, mask: Tensor, seq_index: Tensor) -> Tensor:
    """Per-sequence ``values [N]`` to per-token ``[R, L]``: each token gets its sequence's value, 0 off mask."""
    return torch.where(mask, values[seq_index.clamp(min=0)], 0.0)


def as_float(values: Tensor) -> Tensor:
    """Detached, in float32 at least (a bf16 reward or log-prob would round group statistics)."""
    return values.detach().to(torch.promote_types(values.dtype, torch.float32))


def require_input(inputs: AdvantageInputs, name: str, who: str, provider: str) -> Tensor:
    """The optional per-token input ``inputs.<name>`` detached, or a ValueError saying what provides it."""
    value = getattr(inputs, name)
    if value is None:
        raise ValueError(f"{who} needs inputs.{name}: {provider}")
    if value.shape != inputs.mask.shape:
        raise ValueError(
            f"{who}: inputs.{name} must have the mask's [R, L] shape {tuple(inputs.mask.shape)}, "
            f"got {tuple(value.shape)}"
        )
    return as_float(value)


def valid_seq_index(mask: Tensor, seq_index: Tensor, num_seqs: int, who: str) -> Tensor:
    """Sequence id ``[K]`` of each token on ``mask`` (row-major order), checked to lie in [0, N)."""
    seq = seq_index[mask]
    if seq.numel() and (int(seq.min()) < 0 or int(seq.max()) >= num_seqs):
        raise ValueError(
            f"{who}: seq_index on the mask must be in [0, N={num_seqs}) (every action token belongs to one "
            f"of the N sequences), got values in [{int(seq.min())}, {int(seq.max())}]"
        )
    return seq


def dense_groups(group_ids: Tensor, who: str) -> tuple[Tensor, Tensor]:
    """Dense group index ``[N]`` (0..G-1) and group sizes ``[G]``; refuses unset (negative) ids."""
    if (group_ids < 0).any():
        bad = group_ids[group_ids < 0].unique().tolist()
        raise ValueError(
            f"{who} needs every group id >= 0, got {bad}: -1 is Experience.group_id's 'unset' value; set "
            f"group ids in the workflow (the samples of one task share one id)"
        )
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return group, counts


def group_normalise(
    rewards: Tensor, group: Tensor, counts: Tensor, *, std_normalize: bool, epsilon: float
) -> Tensor:
    """``rewards [N]`` with dense group ids ``group [N]`` (0..G-1) and sizes ``counts [G]`` -> A ``[N]``."""
    num_groups = counts.numel()
    mean, std = group_mean_std(rewards, group, counts)
    centred = rewards - mean[group]
    adv = centred / (std[group] + epsilon) if std_normalize else centred
    all_equal = all_equal_groups(rewards, group, num_groups) & (counts > 1)
    return torch.where(all_equal[group], 0.0, adv)


def group_mean_std(rewards: Tensor, group: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group mean and unbiased std ``[G]``; a group of one gets μ = 0, σ = 1 (docs/algorithms.md §4)."""
    num_groups = counts.numel()
    sizes = counts.to(rewards.dtype)
    mean = group_reduce(rewards, group, num_groups, "sum") / sizes
    sq_dev = (rewards - mean[group]) ** 2
    std = (group_reduce(sq_dev, group, num_groups, "sum") / (sizes - 1).clamp(min=1)).sqrt()
    single = counts == 1
    return torch.where(single, 0.0, mean), torch.where(single, 1.0, std)


def all_equal_groups(rewards: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """``[G]`` bool: the group's rewards are all exactly equal (always true for a group of one)."""
    highest = group_reduce(rewards, group, num_groups, "amax")
    return highest == group_reduce(rewards, group, num_groups, "amin")


def group_reduce(values: Tensor, group: Tensor, num_groups: int, reduce: str) -> Tensor:
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, group, values, reduce=reduce, include_self=False)


def sequence_metrics(seq_adv: Tensor, group: Tensor, counts: Tensor) -> dict[str, float]:
    group_abs_max = group_reduce(seq_adv.abs(), group, counts.numel(), "amax")
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


def whiten_on_mask(values: Tensor, mask: Tensor, epsilon: float = 1e-8) -> Tensor:
    """(x − mean) / sqrt(var + ε) over the tokens on ``mask`` only (unbiased var); 0 off the mask.

    One valid token (or all equal) has var 0 and comes out as exactly 0.
    """
    n = mask.sum()
    kept = torch.where(mask, values, 0.0)  # also drops NaN/inf that may sit off the mask
    mean = kept.sum() / n.clamp(min=1)
    var = torch.where(mask, (values - mean) ** 2, 0.0).sum() / (n - 1).clamp(min=1)
    return torch.where(mask, (values - mean) * torch.rsqrt(var + epsilon), 0.0)


def token_stats(values: Tensor, mask: Tensor) -> tuple[float, float]:
    """Mean and (unbiased) std of ``values`` over the tokens on ``mask``, for metrics."""
    kept = values[mask]
    if kept.numel() == 0:
        return 0.0, 0.0
    return float(kept.mean()), (float(kept.std()) if kept.numel() > 1 else 0.0)


@dataclass(frozen=True)
class SequenceGrid:
    """The tokens on ``mask`` regrouped by sequence: token k sits at grid ``[seq[k], rank[k]]``.

    ``rank`` is the token's position among its sequence's valid tokens, which follows from the layout
    rule "the tokens of one sequence are contiguous and in order within its row": in row-major order
    the valid tokens of a sequence form one run, and rank = index in the run.
    """

    mask: Tensor  # [R, L] bool
    seq: Tensor  # [K] sequence of each valid token (row-major order)
    rank: Tensor  # [K] its index among its sequence's valid tokens
    num_seqs: int
    width: int  # max valid tokens of one sequence

    @classmethod
    def build(cls, mask: Tensor, seq_index: Tensor, num_seqs: int, who: str) -> SequenceGrid:
        seq = valid_seq_index(mask, seq_index, num_seqs, who)
        k = torch.arange(seq.numel(), device=seq.device)
        first = torch.full((num_seqs,), seq.numel(), dtype=torch.long, device=seq.device)
        first = first.scatter_reduce(0, seq, k, reduce="amin")
        last = torch.full_like(first, -1).scatter_reduce(0, seq, k, reduce="amax")
        counts = torch.bincount(seq, minlength=num_seqs)
        split = (counts > 0) & (last - first + 1 != counts)
        if split.any():
            raise ValueError(
                f"{who}: the action tokens of sequence(s) {split.nonzero().flatten()[:10].tolist()} are "
                f"interleaved with another sequence's; seq_index must keep each sequence contiguous "
                f"within one row (trivium.types.collate does)"
            )
        width = int(counts.max()) if seq.numel() else 0
        return cls(mask, seq, k - first[seq], num_seqs, width)

    def to_grid(self, values: Tensor) -> Tensor:
        """``[R, L]`` -> ``[N, W]``: row i holds sequence i's valid-token values in order, then zeros."""
        grid = torch.zeros(self.num_seqs, self.width, dtype=values.dtype, device=values.device)
        grid[self.seq, self.rank] = values[self.mask]
        return grid

    def to_tokens(self, grid: Tensor) -> Tensor:
        """``[N, W]`` -> ``[R, L]`` (0 off the mask)."""
        out = torch.zeros(self.mask.shape, dtype=grid.dtype, device=grid.device)
        out[self.mask] = grid[self.seq, self.rank]
        return out


def discounted_reverse_cumsum(x: Tensor, decay: float) -> Tensor:
    """y[:, k] = Σ_{j ≥ k} decay^{j−k} x[:, j] along the last dim of ``x [N, W]``."""
    if decay == 1.0:
        return x.flip(-1).cumsum(-1).flip(-1)
    if decay == 0.0:
        return x.clone()
    out = torch.empty_like(x)
    running = x.new_zeros(x.shape[0])
    for k in range(x.shape[-1] - 1, -1, -1):  # over token positions; every sequence moves together
        running = x[:, k] + decay * running
        out[:, k] = running
    return out


def check_unit(who: str, **params: float) -> None:
    for name, value in params.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{who} needs 0 <= {name} <= 1 (a discount factor), got {name}={value}")
