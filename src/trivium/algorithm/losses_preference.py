"""DPO (docs/algorithms.md §18): the sigmoid preference loss on summed sequence log-probs of explicit pairs.

L = mean over pairs of −(1 − ε_ls)·log σ(βh) − ε_ls·log σ(−βh),
h = [log π(y_w) − log π_ref(y_w)] − [log π(y_l) − log π_ref(y_l)].

Design decisions:
- Pairs are not Experiences and DPO is not a per-token policy loss, so nothing is registered: the
  trainer computes per-sequence sums of ℓ (``aggregation.sequence_sums``, by ``seq_index``, so packed
  rows work) and picks chosen and rejected sequences by explicit pair indices (``pair_logprobs``), never
  by row order.
- log π(y|x) is the *sum* over response tokens: a mean would drop the length dependence DPO's implicit
  reward relies on (§22.7). log σ(z) is computed as −softplus(−z), finite for any z.

Left out: IPO, hinge and other preference losses; they would sit next to this one with the same inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["dpo_loss", "pair_logprobs"]


def pair_logprobs(sequence_logprobs: Tensor, chosen: Tensor, rejected: Tensor) -> tuple[Tensor, Tensor]:
    """Summed log-probs ``[P]`` of the chosen and of the rejected sequence of each pair.

    ``sequence_logprobs [N]`` per sequence id (from ``sequence_sums(ℓ, mask, seq_index, N)``);
    ``chosen [P]`` / ``rejected [P]`` int64: sequence ids of each pair's two responses, as recorded when
    the pairs were collated. Refuses ids out of range and a sequence used as both sides of a pair.
    """
    n = sequence_logprobs.numel()
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(
            f"chosen and rejected must both be [P] sequence ids, got {tuple(chosen.shape)} and "
            f"{tuple(rejected.shape)}"
        )
    for name, ids in (("chosen", chosen), ("rejected", rejected)):
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < n):
            raise ValueError(f"{name} ids must be sequence ids in [0, {n}), got {ids.tolist()}")
    if bool((chosen == rejected).any()):
        pair = int((chosen == rejected).nonzero()[0])
        raise ValueError(
            f"pair {pair} uses sequence {int(chosen[pair])} as both chosen and rejected; pairs must name "
            f"two different sequences"
        )
    return sequence_logprobs[chosen], sequence_logprobs[rejected]


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    num_pairs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Mean DPO loss over P pairs (0-dim, differentiable in the policy inputs) and metrics.

    Inputs ``[P]``: *summed* response log-probs of each pair's chosen (y_w) and rejected (y_l) response
    under the policy and under the frozen reference (detached here). ``label_smoothing`` = ε_ls, the
    conservative variant's assumed share of flipped labels, in [0, 0.5). For ε_ls = 0, dL/dh = −βσ(−βh).
    Metrics: ``rewards/chosen`` and ``rewards/rejected`` (mean implicit reward β(log π − log π_ref)),
    ``rewards/margin`` (their mean difference), ``rewards/accuracy`` (share of pairs where the chosen
    implicit reward is higher). ``num_pairs``: the pairs of the whole optimiser mini-batch, when these P
    pairs are one micro-batch of it; the loss is then Σ/num_pairs, this micro-batch's share, so summing
    the micro-batch losses gives the mini-batch mean (default: P, the mean over these pairs).
    """
    shapes = {tuple(t.shape) for t in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or policy_chosen.dim() != 1 or policy_chosen.numel() == 0:
        raise ValueError(
            f"dpo_loss needs four [P] tensors with P >= 1 (one entry per pair), got shapes {sorted(shapes)}"
        )
    if not beta > 0:
        raise ValueError(f"dpo_loss beta must be > 0 (0.1 is the usual value), got {beta}")
    if num_pairs is not None and not num_pairs >= policy_chosen.numel():
        raise ValueError(
            f"dpo_loss num_pairs={num_pairs} (pairs in the mini-batch) must be >= the {policy_chosen.numel()} "
            f"pairs given"
        )
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo_loss label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_reward = beta * (policy_chosen - ref_chosen.detach())
    rejected_reward = beta * (policy_rejected - ref_rejected.detach())
    z = chosen_reward - rejected_reward  # β·h
    # −log σ(z) = softplus(−z), −log σ(−z) = softplus(z)
    per_pair = (1.0 - label_smoothing) * F.softplus(-z) + label_smoothing * F.softplus(z)
    loss = per_pair.sum() / (per_pair.numel() if num_pairs is None else num_pairs)
    with torch.no_grad():
        metrics = {
            "loss/dpo": float(loss),
            "rewards/chosen": float(chosen_reward.mean()),
            "rewards/rejected": float(rejected_reward.mean()),
            "rewards/margin": float(z.mean()),
            "rewards/accuracy": float((z > 0).float().mean()),
        }
    return loss, metrics
