"""The actor loss the trainer calls once per micro-batch (docs/algorithms.md §2.3).

L_actor = agg(λ_policy) + β·agg(k(ℓ, ℓref)) − c_H·agg(H), every term with the same aggregation mode and the
same mini-batch ``LossScale``, so the sum of this loss over the micro-batches of a mini-batch is the
mini-batch loss (gradient accumulation needs no further scaling). ``inputs.is_expert`` reaches the
aggregation too (only the ``chord`` mode reads it).

The entropy H (§2.2) comes in as a tensor: it needs the full-vocabulary logits, which only the trainer
holds (``entropy_from_logits`` in ``losses_entropy``); passing ``[R, L]`` keeps this function free of
the vocabulary dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from trivium.algorithm.aggregation import LossScale, aggregate, masked_mean
from trivium.algorithm.policy_losses import PolicyLossInputs
from trivium.algorithm.registry import KL_FNS, POLICY_LOSS_FNS

__all__ = ["actor_loss"]


def actor_loss(
    inputs: PolicyLossInputs,
    *,
    policy_loss: str,
    policy_loss_args: Mapping[str, Any],
    aggregation: str,
    scale: LossScale,
    kl_estimator: str | None = None,
    kl_coef: float = 0.0,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's share of the actor loss (0-dim, differentiable in ``inputs.logprobs``) and metrics.

    ``scale`` must come from the whole optimiser mini-batch (``loss_scale``), never from this micro-batch.
    The KL term is on when ``kl_coef > 0``; with ``kl_coef == 0`` and ``ref_logprobs`` given it is only
    measured (``kl/mean``). Likewise ``entropy [R, L]`` (target-aligned, differentiable) is measured
    whenever given (``entropy/mean``) and subtracted as −entropy_coef·agg(H) when ``entropy_coef > 0``.
    Metric ``loss/*`` values are shares: sum them over micro-batches; the other metrics are micro-batch
    means: average them.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and kl_estimator is None:
        raise ValueError(f"kl_coef={kl_coef} needs kl_estimator, one of: {', '.join(KL_FNS.names())}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError(
            f"kl_coef={kl_coef} needs ref_logprobs (log-probs of the sampled tokens under the reference "
            f"model); compute them, or set kl_coef=0 to train without the KL term"
        )
    if entropy_coef < 0:
        raise ValueError(f"entropy_coef must be >= 0 (a bonus; 0.001 is typical), got {entropy_coef}")
    if entropy_coef > 0 and entropy is None:
        raise ValueError(
            f"entropy_coef={entropy_coef} needs entropy ([R, L], entropy_from_logits of the "
            f"temperature-scaled logits); compute it, or set entropy_coef=0"
        )
    POLICY_LOSS_FNS.check_args(policy_loss, policy_loss_args)
    mask, seq_index, is_expert = inputs.mask, inputs.seq_index, inputs.is_expert
    per_token, part_metrics = POLICY_LOSS_FNS.get(policy_loss)(inputs, **policy_loss_args)
    policy = aggregate(per_token, mask, seq_index, aggregation, scale, is_expert)
    total = policy
    metrics = {"loss/policy": float(policy.detach())}

    if kl_estimator is not None and ref_logprobs is not None:
        kl = KL_FNS.get(kl_estimator)(inputs.logprobs, ref_logprobs.detach())
        metrics["kl/mean"] = float(masked_mean(kl.detach(), mask))
        if kl_coef > 0:
            kl_loss = aggregate(kl, mask, seq_index, aggregation, scale, is_expert)
            total = total + kl_coef * kl_loss
            metrics["loss/kl"] = float(kl_loss.detach())

    if entropy is not None:
        metrics["entropy/mean"] = float(masked_mean(entropy.detach(), mask))
        if entropy_coef > 0:
            entropy_term = aggregate(entropy, mask, seq_index, aggregation, scale, is_expert)
            total = total - entropy_coef * entropy_term
            metrics["loss/entropy"] = float(entropy_term.detach())

    metrics["loss/actor"] = float(total.detach())
    return total, {**part_metrics, **metrics}
