"""PPO's clipped value loss for the critic (docs/algorithms.md §3).

λ^V = ½·max((V − Ret)², (V^clip − Ret)²), V^clip = clip(V, V^old − ε_V, V^old + ε_V), aggregated like the
policy loss (same modes, same mini-batch ``LossScale``) so gradient accumulation stays exact.

Design decision: a plain function, not a registry entry: there is one value loss; ``clip=None`` gives the
unclipped ½(V − Ret)². Returns and old values are detached here whatever the caller passes (§0.1).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trivium.algorithm.aggregation import LossScale, aggregate, masked_mean

__all__ = ["value_loss"]


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    seq_index: Tensor,
    *,
    scale: LossScale,
    clip: float | None = 0.5,
    aggregation: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's share (0-dim, differentiable in ``values``) of the critic loss, and metrics.

    All tensors ``[R, L]``, target-aligned: ``values`` = V of the current critic, ``old_values`` = V^old
    at sampling time, ``returns`` = Ret (GAE targets, taken before advantage whitening). ``clip`` = ε_V
    (0.5; some implementations use 0.2). Metrics are over this micro-batch's valid tokens:
    ``value/clip_fraction`` (share where the clipped branch is the larger one), ``value/explained_variance``
    = 1 − Var(Ret − V)/Var(Ret) (1: perfect, 0: no better than a constant; NaN when Var(Ret) = 0).
    """
    if clip is not None and not clip > 0:
        raise ValueError(f"value_loss clip (ε_V) must be > 0 or None (unclipped), got {clip}")
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns).square()
    if clip is None:
        per_token, clipped_share = 0.5 * unclipped, torch.zeros_like(unclipped)
    else:
        clipped_values = torch.minimum(torch.maximum(values, old_values - clip), old_values + clip)
        clipped = (clipped_values - returns).square()
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        clipped_share = (clipped > unclipped).float()
    loss = aggregate(per_token, mask, seq_index, aggregation, scale)
    with torch.no_grad():
        v, ret = values.detach()[mask], returns[mask]
        var_returns = ret.var(unbiased=False) if ret.numel() else torch.tensor(0.0)
        explained = 1.0 - (ret - v).var(unbiased=False) / var_returns if var_returns > 0 else float("nan")
        metrics = {
            "loss/value": float(loss.detach()),
            "value/clip_fraction": float(masked_mean(clipped_share, mask)),
            "value/explained_variance": float(explained),
            "value/mean": float(masked_mean(values.detach(), mask)),
        }
    return loss, metrics
