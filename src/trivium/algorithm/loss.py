"""The actor loss the trainer calls once per micro-batch (ALGORITHMS.md §2.3).

L_actor = agg(λ_policy) + β·agg(k(ℓ, ℓref)), both terms with the same aggregation mode and the same
mini-batch ``LossScale``, so the sum of this loss over the micro-batches of a mini-batch is the
mini-batch loss (gradient accumulation needs no further scaling).

The entropy bonus (−c_H·agg(H), §2.2) is not here yet: H needs the full-vocabulary logits, which this
function does not receive. It will enter as one more aggregated term once the trainer passes them.
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
) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's share of the actor loss (0-dim, differentiable in ``inputs.logprobs``) and metrics.

    ``scale`` must come from the whole optimiser mini-batch (``loss_scale``), never from this micro-batch.
    The KL term is on when ``kl_coef > 0``; with ``kl_coef == 0`` and ``ref_logprobs`` given it is only
    measured (``kl/mean``). Metric ``loss/*`` values are shares: sum them over micro-batches; the other
    metrics are micro-batch means: average them.
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
    POLICY_LOSS_FNS.check_args(policy_loss, policy_loss_args)
    per_token, part_metrics = POLICY_LOSS_FNS.get(policy_loss)(inputs, **policy_loss_args)
    policy = aggregate(per_token, inputs.mask, inputs.seq_index, aggregation, scale)
    total = policy
    metrics = {"loss/policy": float(policy.detach())}

    if kl_estimator is not None and ref_logprobs is not None:
        kl = KL_FNS.get(kl_estimator)(inputs.logprobs, ref_logprobs.detach())
        metrics["kl/mean"] = float(masked_mean(kl.detach(), inputs.mask))
        if kl_coef > 0:
            kl_loss = aggregate(kl, inputs.mask, inputs.seq_index, aggregation, scale)
            total = total + kl_coef * kl_loss
            metrics["loss/kl"] = float(kl_loss.detach())

    metrics["loss/actor"] = float(total.detach())
    return total, {**part_metrics, **metrics}
