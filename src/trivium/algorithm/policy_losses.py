"""Policy losses: per-token loss λ ``[R, L]`` (0 off the mask) and metrics, before aggregation.

Design decisions:
- A loss returns λ per token, not a scalar: the aggregation mode (``aggregation.py``) is chosen by the
  preset, and one place owns the mini-batch denominators.
- Ratios are exp of a clamped log-prob difference and keep their gradient: on-policy ρ = 1 in value but
  ∇ρ = ∇ℓ (ALGORITHMS.md §0.4); replacing ρ by 1 would silently zero the policy gradient.
- Metrics are means over this micro-batch's masked tokens only (prompt, padding and tool tokens never
  count); the trainer averages them over micro-batches.

Left out: GSPO, CISPO, SAPO and the other §9–§16 losses; each registers here with the same signature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.algorithm.aggregation import masked_mean
from trivium.algorithm.registry import POLICY_LOSS_FNS

__all__ = ["PolicyLossInputs", "ppo_clip", "sft"]


@dataclass(frozen=True)
class PolicyLossInputs:
    """Target-aligned per-token tensors of one micro-batch, all ``[R, L]`` (see ``trivium.types``)."""

    logprobs: Tensor  # ℓ: current policy, differentiable
    old_logprobs: Tensor  # ℓold: behaviour policy, fixed over all epochs on one batch
    advantages: Tensor  # A_{i,t}: detached, 0 off the mask
    mask: Tensor  # bool: True on action tokens we train on
    seq_index: Tensor  # int64: sequence id of each token, -1 on padding
    # Optional inputs, present when a loss needs them:
    rollout_logprobs: Tensor | None = None  # [R, L]: the rollout engine's log-probs (truncated IS, mismatch)
    ref_logprobs: Tensor | None = None  # [R, L]: reference model (regularisers)
    is_expert: Tensor | None = None  # [R, L] bool: tokens of expert demonstrations mixed into the batch (CHORD)
    step: int = 0  # global training step (schedules, e.g. CHORD's μ)

    def __post_init__(self) -> None:
        shapes = {
            name: tuple(getattr(self, name).shape)
            for name in ("logprobs", "old_logprobs", "advantages", "mask", "seq_index")
        }
        if len(set(shapes.values())) != 1:
            raise ValueError(f"PolicyLossInputs tensors must share one [R, L] shape, got {shapes}")
        if self.mask.dtype != torch.bool:
            raise ValueError(f"PolicyLossInputs.mask must be bool, got {self.mask.dtype}")


@POLICY_LOSS_FNS.register("ppo_clip")
def ppo_clip(
    inputs: PolicyLossInputs, *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (ALGORITHMS.md §3), with DAPO's decoupled bounds (§6) and dual-clip.

    λ = max(−Aρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high)); with ``dual_clip = c`` and A < 0,
    λ = min(λ, −c·A). The gradient is zero where a clipped branch is active.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"ppo_clip needs clip_low, clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(
            f"ppo_clip dual_clip must be > 1 (a cap of c·|A| for A < 0) or None, got {dual_clip}"
        )
    mask, adv = inputs.mask, inputs.advantages
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {
            "policy/clip_fraction": float(masked_mean((clipped > unclipped).float(), mask)),
            "policy/ratio_mean": float(masked_mean(ratio, mask)),
            "policy/approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    if dual_clip is not None:
        capped = (adv < 0) & (loss > -dual_clip * adv)
        loss = torch.where(capped, -dual_clip * adv, loss)
        metrics["policy/dual_clip_fraction"] = float(masked_mean(capped.float(), mask))
    return torch.where(mask, loss, 0.0), metrics


@POLICY_LOSS_FNS.register("sft")
def sft(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Masked negative log-likelihood λ = −ℓ (ALGORITHMS.md §17); advantages and old log-probs unused."""
    nll = torch.where(inputs.mask, -inputs.logprobs, 0.0)
    return nll, {"sft/nll": float(masked_mean(nll.detach(), inputs.mask))}
