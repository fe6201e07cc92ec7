"""Loss aggregation (docs/algorithms.md §1): how a per-token loss λ [R, L] becomes one scalar.

Design decisions:
- Every mode is linear in λ, so each is written as per-token weights w [R, L] and the loss is Σ w·λ.
- The weights divide by the denominators of the whole optimiser mini-batch (``LossScale``, computed once
  before micro-batching). A micro-batch's loss is then its exact share of the mini-batch loss, and
  gradient accumulation (summing micro-batch losses) gives the same loss and gradient however the
  mini-batch was split (docs/algorithms.md §22.3). The one per-micro-batch quantity is n_i in
  seq-mean-token-mean, which is exact because a sequence is never split across micro-batches.
- Per-sequence sums go through ``seq_index``, never through rows: padded and packed rows look the same.
- Mixed batches (CHORD, §16) normalise each part by its own size: on-policy tokens U by |U| and expert
  tokens E by |E|, both counted over the whole mini-batch. That needs to know which part a token is in,
  so every weight function receives the optional ``is_expert [R, L]`` mask; the §1 modes ignore it, and
  the ``chord`` mode (token-mean within each part) uses it with ``LossScale.num_expert_tokens``. Putting
  the split here rather than in the loss keeps the loss free of global counts, and keeps the split
  exact under any micro-batching.

Left out: the data-parallel reduction. With several ranks, all-reduce (sum) ``num_tokens``, ``num_seqs``
and ``num_expert_tokens`` before building the ``LossScale``; nothing here calls torch.distributed.
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
    (which would change from step to step and rescale the loss with it). ``num_expert_tokens`` = the
    masked tokens of expert demonstrations (CHORD's set E, a subset of ``num_tokens``; 0 without experts).
    """

    num_tokens: float
    num_seqs: float
    norm_constant: float
    num_expert_tokens: float = 0.0

    def __post_init__(self) -> None:
        if self.num_tokens < 0 or self.num_seqs < 0:
            raise ValueError(f"LossScale counts must be >= 0, got {self}")
        if not 0 <= self.num_expert_tokens <= self.num_tokens:
            raise ValueError(
                f"LossScale.num_expert_tokens={self.num_expert_tokens} must be in [0, num_tokens="
                f"{self.num_tokens}] (expert tokens are a subset of the masked tokens)"
            )
        if not self.norm_constant > 0:
            raise ValueError(
                f"LossScale.norm_constant must be > 0 (the max response length), got {self.norm_constant}"
            )


def loss_scale(
    mask: Tensor, seq_index: Tensor, norm_constant: float, is_expert: Tensor | None = None
) -> LossScale:
    """Denominators of the mini-batch given by ``mask [R, L]`` and ``seq_index [R, L]`` (all of it).

    ``is_expert [R, L]`` bool (optional) marks the tokens of expert demonstrations; give it whenever the
    mini-batch mixes them in, so that the ``chord`` mode can normalise each part by its own size.
    """
    if is_expert is None:
        _check_layout(mask=mask, seq_index=seq_index)
        num_expert = 0.0
    else:
        _check_layout(mask=mask, seq_index=seq_index, is_expert=is_expert)
        num_expert = float((mask & is_expert).sum())
    return LossScale(
        num_tokens=float(mask.sum()),
        num_seqs=float(torch.unique(seq_index[mask]).numel()),
        norm_constant=float(norm_constant),
        num_expert_tokens=num_expert,
    )


def aggregate(
    values: Tensor,
    mask: Tensor,
    seq_index: Tensor,
    mode: str,
    scale: LossScale,
    is_expert: Tensor | None = None,
) -> Tensor:
    """This micro-batch's share of the mini-batch loss: Σ_t w_t·λ_t over ``mask``, a 0-dim tensor.

    ``values [R, L]`` may hold anything (even NaN) off the mask: those entries never reach the sum.
    ``is_expert [R, L]`` bool: expert-demonstration tokens (only the ``chord`` mode looks at it).
    """
    if is_expert is None:
        _check_layout(values=values, mask=mask, seq_index=seq_index)
    else:
        _check_layout(values=values, mask=mask, seq_index=seq_index, is_expert=is_expert)
    weights = AGGREGATIONS.get(mode)(mask, seq_index, scale, is_expert=is_expert)
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


# Registered weights: fn(mask [R, L] bool, seq_index [R, L], scale, *, is_expert [R, L] bool | None)
#   -> w [R, L] float, 0 off the mask. The §1 modes do not look at is_expert.


@AGGREGATIONS.register("token-mean")
def token_mean(
    mask: Tensor, seq_index: Tensor, scale: LossScale, *, is_expert: Tensor | None = None
) -> Tensor:
    """Σ m λ / Σ m: every token weighs the same (long responses weigh more). DAPO's token-level loss."""
    return mask / max(scale.num_tokens, 1.0)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(
    mask: Tensor, seq_index: Tensor, scale: LossScale, *, is_expert: Tensor | None = None
) -> Tensor:
    """(1/N') Σ_i Σ_t m λ."""
    return mask / max(scale.num_seqs, 1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(
    mask: Tensor, seq_index: Tensor, scale: LossScale, *, is_expert: Tensor | None = None
) -> Tensor:
    """(1/N') Σ_i (1/n_i) Σ_t m λ: every response weighs the same (original GRPO paper)."""
    n = sequence_sums(mask.float(), mask, seq_index)
    n_per_token = n[seq_index.clamp(min=0)].clamp(min=1)
    return mask / (n_per_token * max(scale.num_seqs, 1.0))


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    mask: Tensor, seq_index: Tensor, scale: LossScale, *, is_expert: Tensor | None = None
) -> Tensor:
    """(1/(N'·C)) Σ_i Σ_t m λ: Dr. GRPO, no length normalisation per response (C is a constant)."""
    return mask / (max(scale.num_seqs, 1.0) * scale.norm_constant)


@AGGREGATIONS.register("chord")
def token_mean_per_part(
    mask: Tensor, seq_index: Tensor, scale: LossScale, *, is_expert: Tensor | None = None
) -> Tensor:
    """Token-mean within each part (docs/algorithms.md §16): U tokens by 1/|U|, expert tokens E by 1/|E|.

    With the ``chord`` loss's λ = (1 − μ)·λ_RL on U and μ·λ_SFT on E this gives
    L = (1 − μ)·token-mean_U(λ_RL) + μ·token-mean_E(λ_SFT). Plain token-mean would instead weigh the
    parts by their token shares (|U|/(|U|+|E|) and |E|/(|U|+|E|)), i.e. change μ with every batch.
    |U| and |E| are mini-batch counts, so each part is a mean over its whole mini-batch subset however the
    micro-batches are cut. Without expert tokens (``is_expert`` None) it equals token-mean. A KL or
    entropy term aggregated in this mode is likewise its token-mean over U plus its token-mean over E.
    """
    num_expert = scale.num_expert_tokens
    num_rl = max(scale.num_tokens - num_expert, 1.0)
    if is_expert is None:
        if num_expert > 0:
            raise ValueError(
                f"aggregation 'chord': the LossScale counts {num_expert:g} expert tokens but is_expert was "
                f"not given; pass the same is_expert mask to aggregate (actor_loss takes it from inputs)"
            )
        return mask / num_rl
    expert = mask & is_expert
    if num_expert == 0 and bool(expert.any()):
        raise ValueError(
            "aggregation 'chord': this micro-batch has expert tokens but LossScale.num_expert_tokens is 0; "
            "build the scale with loss_scale(mask, seq_index, norm_constant, is_expert=...)"
        )
    return torch.where(expert, 1.0 / max(num_expert, 1.0), mask / num_rl)


def _check_layout(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"per-token tensors must share one [R, L] shape, got {shapes}")
    mask = tensors["mask"]
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True on trained tokens), got dtype {mask.dtype}")
    if "is_expert" in tensors and tensors["is_expert"].dtype != torch.bool:
        raise ValueError(
            f"is_expert must be a bool tensor (True on expert-demonstration tokens), got dtype "
            f"{tensors['is_expert'].dtype}"
        )
