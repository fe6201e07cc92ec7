"""Per-token entropy of the policy over the whole vocabulary (docs/algorithms.md §2.2), for the entropy bonus.

H = −Σ_v p_v log p_v = logsumexp(z) − Σ_v p_v z_v with p = softmax(z), z = logits / temperature: the
second form needs one softmax and no log of small probabilities, so it stays finite for peaked
distributions. Computed in float32 whatever the logits' dtype (bf16 sums over 10⁵ entries are too coarse).

Memory: two float32 ``[R, L, V]`` tensors (z and p) live until backward. When the entropy is only a
metric (coefficient 0), call this under ``torch.no_grad()`` so that nothing is kept. Left out: chunking
over positions, which would bound the forward peak but not what autograd keeps for backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy_from_logits"]


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy ``[...]`` (nats) of softmax(logits / temperature) over the last dim of ``logits [..., V]``.

    Pass the trainer's logits ``[R, L, V]`` aligned on target positions (the distribution that predicted
    token ``[r, t]``) to get ``[R, L]`` in the loss layout; differentiable. Use the sampling temperature
    so that H is the entropy of the distribution the rollouts came from (§0.3). ``-inf`` logits (banned
    tokens) contribute 0.
    """
    if not temperature > 0:
        raise ValueError(
            f"entropy_from_logits needs temperature > 0 (the sampling temperature), got {temperature}"
        )
    z = logits.float() / temperature  # a new tensor even for float32 logits at temperature 1
    z.clamp_(min=torch.finfo(z.dtype).min)  # −inf → finite, so p·z = 0 there instead of 0·(−inf) = NaN
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - torch.einsum("...v,...v->...", p, z)  # no [.., V] product kept
