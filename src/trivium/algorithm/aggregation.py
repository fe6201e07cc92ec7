"""Loss aggregation (ALGORITHMS.md §1): how a per-token loss λ [R, L] becomes one scalar.

Design decisions:
- Every mode is linear in λ, so each is written as per-token weights w [R, L] and the loss is Σ w·λ.
- The weights divide by the denominators of the whole optimiser mini-batch (``LossScale``, computed once
  before micro-batching). A micro-batch's loss is then its exact share of the mini-batch loss, and
  gradient accumulation (summing micro-batch losses) gives the same loss and gradient however the
  mini-batch was split (ALGORITHMS.md §22.3). The one per-micro-batch quantity is n_i in
  seq-mean-token-mean, which is exact because a sequence is never split across micro-batches.
- Per-sequence sums go through ``seq_index``, never through rows: padded and packed rows look the same.

Left out: the data-parallel reduction. With several ranks, all-reduce (sum) ``num_tokens`` and
``num_seqs`` before building the ``LossScale``; nothing here calls torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.algorithm.registry import AGGREGATIONS

__all__ = ["LossScale", "aggregate", "loss_scale", "masked_mean", "sequence_sums"]


@dataclass(frozen=True)
class LossScale:
    """Global denominators of one optimiser mini-batch.

    ``num_tokens`` = Σ mask; ``num_seqs`` = N', the sequences with n_i > 0; ``norm_constant`` = C of
    seq-mean-token-sum-norm: the configured maximum response length, never the padded length of a batch
    (which would change from step to step and rescale the loss with it).
    """

    num_tokens: float
    num_seqs: float
    norm_constant: float

    def __post_init__(self) -> None:
        if self.num_tokens < 0 or self.num_seqs < 0:
            raise ValueError(f"LossScale counts must be >= 0, got {self}")
        if not self.norm_constant > 0:
            raise ValueError(
                f"LossScale.norm_constant must be > 0 (the max response length), got {self.norm_constant}"
            )


def loss_scale(mask: Tensor, seq_index: Tensor, norm_constant: float) -> LossScale:
    """Denominators of the mini-batch given by ``mask [R, L]`` and ``seq_index [R, L]`` (all of it)."""
    _check_layout(mask=mask, seq_index=seq_index)
    return LossScale(
        num_tokens=float(mask.sum()),
        num_seqs=float(torch.unique(seq_index[mask]).numel()),
        norm_constant=float(norm_constant),
    )


def aggregate(values: Tensor, mask: Tensor, seq_index: Tensor, mode: str, scale: LossScale) -> Tensor:
    """This micro-batch's share of the mini-batch loss: Σ_t w_t·λ_t over ``mask``, a 0-dim tensor.

    ``values [R, L]`` may hold anything (even NaN) off the mask: those entries never reach the sum.
    """
    _check_layout(values=values, mask=mask, seq_index=seq_index)
    weights = AGGREGATIONS.get(mode)(mask, seq_index, scale)
    return torch.where(mask, values * weights, 0.0).sum()


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over ``mask`` in this micro-batch (0 when the mask is empty); for metrics."""
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def sequence_sums(values: Tensor, mask: Tensor, seq_index: Tensor, num_seqs: int | None = None) -> Tensor:
    """Per-sequence sums ``[S]`` of ``values [R, L]`` over ``mask``; S = ``num_seqs`` or max id + 1."""
    if num_seqs is None:
        num_seqs = int(seq_index.max().clamp(min=-1)) + 1 if seq_index.numel() else 0
    masked = torch.where(mask, values, 0.0).flatten()
    out = torch.zeros(num_seqs, dtype=masked.dtype, device=masked.device)
    return out.index_add_(0, seq_index.clamp(min=0).flatten(), masked)


# Registered weights: fn(mask [R, L] bool, seq_index [R, L], scale) -> w [R, L] float, 0 off the mask.


@AGGREGATIONS.register("token-mean")
def token_mean(mask: Tensor, seq_index: Tensor, scale: LossScale) -> Tensor:
    """Σ m λ / Σ m: every token weighs the same (long responses weigh more). DAPO's token-level loss."""
    return mask / max(scale.num_tokens, 1.0)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(mask: Tensor, seq_index: Tensor, scale: LossScale) -> Tensor:
    """(1/N') Σ_i Σ_t m λ."""
    return mask / max(scale.num_seqs, 1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(mask: Tensor, seq_index: Tensor, scale: LossScale) -> Tensor:
    """(1/N') Σ_i (1/n_i) Σ_t m λ: every response weighs the same (original GRPO paper)."""
    n = sequence_sums(mask.float(), mask, seq_index)
    n_per_token = n[seq_index.clamp(min=0)].clamp(min=1)
    return mask / (n_per_token * max(scale.num_seqs, 1.0))


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(mask: Tensor, seq_index: Tensor, scale: LossScale) -> Tensor:
    """(1/(N'·C)) Σ_i Σ_t m λ: Dr. GRPO, no length normalisation per response (C is a constant)."""
    return mask / (max(scale.num_seqs, 1.0) * scale.norm_constant)


def _check_layout(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"per-token tensors must share one [R, L] shape, got {shapes}")
    mask = tensors["mask"]
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True on trained tokens), got dtype {mask.dtype}")
