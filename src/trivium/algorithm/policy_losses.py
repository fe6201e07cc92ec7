"""Policy losses: per-token loss λ ``[R, L]`` (0 off the mask) and metrics, before aggregation.

Design decisions:
- A loss returns λ per token, not a scalar: the aggregation mode (``aggregation.py``) is chosen by the
  preset, and one place owns the mini-batch denominators.
- Ratios are exp of a clamped log-prob difference and keep their gradient: on-policy ρ = 1 in value but
  ∇ρ = ∇ℓ (docs/algorithms.md §0.4); replacing ρ by 1 would silently zero the policy gradient.
- Metrics are means over this micro-batch's masked tokens only (prompt, padding and tool tokens never
  count); the trainer averages them over micro-batches.

Token-level losses live here (PPO, IS-PG, CISPO, SAPO, sPPO, SFT); losses that need per-sequence ratios
or several parts live in ``losses_*.py`` (GSPO/TOPR/sequence PPO, REC, CHORD), imported at the end of
this file so that importing it registers every policy loss.

Several losses (CISPO, TOPR, REC) put ℓ itself, not ρ, in λ: only their gradient is meaningful, so their
``loss/policy`` value must not be compared across algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.algorithm.aggregation import masked_mean
from trivium.algorithm.registry import POLICY_LOSS_FNS

__all__ = [
    "PolicyLossInputs",
    "cispo",
    "is_pg",
    "m2po",
    "mini_batch_rule",
    "ppo_clip",
    "sapo",
    "second_moment_mask",
    "sft",
    "sppo",
    "token_log_ratio",
]


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
    is_expert: Tensor | None = (
        None  # [R, L] bool: tokens of expert demonstrations mixed into the batch (CHORD)
    )
    step: int = 0  # global training step (schedules, e.g. CHORD's μ)
    keep: Tensor | None = (
        None  # [R, L] bool: the tokens a loss's mini-batch rule kept (see ``mini_batch_rule``)
    )

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
    """PPO clipped surrogate (docs/algorithms.md §3), with DAPO's decoupled bounds (§6) and dual-clip.

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
    """Masked negative log-likelihood λ = −ℓ (docs/algorithms.md §17); advantages and old log-probs unused."""
    nll = torch.where(inputs.mask, -inputs.logprobs, 0.0)
    return nll, {"sft/nll": float(masked_mean(nll.detach(), inputs.mask))}


@POLICY_LOSS_FNS.register("is_pg")
def is_pg(inputs: PolicyLossInputs) -> tuple[Tensor, dict[str, float]]:
    """Importance-sampled policy gradient without clipping, λ = −ρ·A (docs/algorithms.md §19).

    The on-policy distillation loss: with A = λ_KL(ℓT − ℓold) its gradient on-policy is −A∇ℓ, the
    per-position reverse-KL gradient. Use ``ppo_clip`` for the clipped, more stable variant.
    Aggregation: token-mean.
    """
    log_ratio = token_log_ratio(inputs)
    ratio = log_ratio.exp()
    loss = -inputs.advantages * ratio
    with torch.no_grad():
        metrics = {
            "policy/ratio_mean": float(masked_mean(ratio, inputs.mask)),
            "policy/approx_kl": float(masked_mean(-log_ratio, inputs.mask)),
        }
    return torch.where(inputs.mask, loss, 0.0), metrics


@POLICY_LOSS_FNS.register("m2po")
def m2po(inputs: PolicyLossInputs, *, m2_threshold: float = 0.04) -> tuple[Tensor, dict[str, float]]:
    """M2PO (Zheng et al. 2025, arXiv:2510.01161; docs/algorithms.md §23): stale samples kept, outliers masked.

    With samples drawn by older weights (``synchronizer.sync_offset``) PPO's ratio against the trainer's
    own old log-probs ignores that the samples came from another policy, and a ratio against the sampling
    policy would be clipped on most stale tokens. M2PO takes the importance weight against the behaviour
    policy (the rollout engine's log-probs ℓrollout) unclipped, and bounds its variance instead: with
    log r = ℓold − ℓrollout, it masks the tokens of largest (log r)² until the mean of (log r)² over the
    tokens left is at most ``m2_threshold`` (τ_M2), so a batch of mildly stale tokens trains whole and only
    extreme outliers drop. λ = −M·ρ·A with ρ = exp(ℓ − ℓrollout): the gradient −M·ρ·A·∇ℓ corrects for the
    staleness. On-policy ℓrollout is ℓold up to the engine/trainer mismatch: plain IS policy gradient.

    The mask is a mini-batch rule (``mini_batch_rule``): the trainer computes it over the whole optimiser
    mini-batch before its first update, from the old log-probs of an extra forward pass, and passes each
    micro-batch its part (``inputs.keep``), so the update does not depend on the micro-batch split. Called
    without ``keep``, the loss computes it over the tokens it is given. Aggregation: token-mean.
    """
    if not m2_threshold > 0:
        raise ValueError(
            f"m2po needs m2_threshold > 0 (the bound on the mean squared log-ratio), got {m2_threshold}"
        )
    if inputs.rollout_logprobs is None:
        raise ValueError(
            "m2po needs the rollout engine's log-probs (PolicyLossInputs.rollout_logprobs): it measures how "
            "stale each token is against the policy that sampled it"
        )
    mask, adv = inputs.mask, inputs.advantages
    with torch.no_grad():
        stale = (inputs.old_logprobs - inputs.rollout_logprobs).clamp(-20.0, 20.0)
        keep = inputs.keep if inputs.keep is not None else second_moment_mask(stale, mask, m2_threshold)
    log_ratio = (inputs.logprobs - inputs.rollout_logprobs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss = -adv * ratio
    with torch.no_grad():
        kept = mask & keep
        metrics = {
            "m2po/masked_fraction": float(masked_mean((mask & ~keep).float(), mask)),
            "m2po/m2_before": float(masked_mean(stale.square(), mask)),
            "m2po/m2_after": float(masked_mean(stale.square(), kept)) if bool(kept.any()) else 0.0,
            "policy/ratio_mean": float(masked_mean(ratio, mask)),
            "policy/approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return torch.where(kept, loss, 0.0), metrics


def _m2po_rule(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, m2_threshold: float = 0.04
) -> Tensor:
    return second_moment_mask((old_logprobs - rollout_logprobs).clamp(-20.0, 20.0), mask, m2_threshold)


m2po.mini_batch_rule = _m2po_rule  # type: ignore[attr-defined]


def mini_batch_rule(loss_fn):
    """The loss's rule over a whole mini-batch, if it has one: ``rule(old_logprobs, rollout_logprobs, mask,
    **policy_loss_args) -> keep [R, L] bool``. A token selection that compares tokens with each other (M2PO's
    second moment) must see the mini-batch, not a micro-batch: the trainer computes it once per mini-batch
    (old log-probs first) and hands each micro-batch its ``PolicyLossInputs.keep``. A loss declares one by
    setting the attribute ``mini_batch_rule`` on its function."""
    return getattr(loss_fn, "mini_batch_rule", None)


def second_moment_mask(log_ratio: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """M2PO's mask: ``mask`` less the fewest tokens of largest (log r)² that bring the mean of (log r)² over
    the tokens left to at most ``threshold``; ``[R, L]`` bool. Masking the largest first one at a time (the
    paper's loop) keeps the k smallest for the largest k whose mean is at most τ: one sort and a cumsum."""
    squares = log_ratio.square()[mask]
    keep = torch.zeros_like(mask)
    if squares.numel() == 0:
        return keep
    ordered, order = torch.sort(squares)
    count = torch.arange(1, ordered.numel() + 1, device=ordered.device, dtype=ordered.dtype)
    under = (ordered.cumsum(0) / count) <= threshold  # prefix means of the smallest: non-decreasing in k
    kept = int(under.sum())
    flat = torch.zeros_like(squares, dtype=torch.bool)
    flat[order[:kept]] = True
    keep[mask] = flat
    return keep


@POLICY_LOSS_FNS.register("cispo")
def cispo(
    inputs: PolicyLossInputs,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    mask_clip_low: float | None = None,
    mask_clip_high: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (docs/algorithms.md §10): λ = −sg[clip(ρ, 1 − clip_low, 1 + clip_high)]·A·ℓ.

    The IS weight is clipped and detached, the update itself is never clipped: every token keeps the
    gradient −w·A·∇ℓ (PPO would zero it outside its band). ``clip_low = 1`` puts the lower bound at 0,
    i.e. only the cap 1 + clip_high acts, as in the paper. ``mask_clip_low`` / ``mask_clip_high`` (off
    when None) add the optional PPO-like trust-region mask M: λ = 0 where A > 0 and ρ > 1 + mask_clip_high
    or A < 0 and ρ < 1 − mask_clip_low. The value holds ℓ, so only its gradient is meaningful.
    Aggregation: token-mean.
    """
    if not 0 <= clip_low <= 1 or clip_high < 0:
        raise ValueError(
            f"cispo needs 0 <= clip_low <= 1 (1: no lower bound) and clip_high >= 0, got {clip_low}, {clip_high}"
        )
    mask, adv = inputs.mask, inputs.advantages
    with torch.no_grad():
        ratio = token_log_ratio(inputs).exp()
        weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        keep = torch.ones_like(mask)
        if mask_clip_high is not None:
            keep &= ~((adv > 0) & (ratio > 1.0 + mask_clip_high))
        if mask_clip_low is not None:
            keep &= ~((adv < 0) & (ratio < 1.0 - mask_clip_low))
        metrics = {
            "policy/clip_fraction": float(masked_mean((weight != ratio).float(), mask)),
            "policy/ratio_mean": float(masked_mean(ratio, mask)),
            "cispo/weight_mean": float(masked_mean(weight, mask)),
        }
        if mask_clip_low is not None or mask_clip_high is not None:
            metrics["cispo/masked_fraction"] = float(masked_mean((~keep).float(), mask))
    loss = -weight * adv * inputs.logprobs
    return torch.where(mask & keep, loss, 0.0), metrics


@POLICY_LOSS_FNS.register("sapo")
def sapo(
    inputs: PolicyLossInputs, *, tau_pos: float = 1.0, tau_neg: float = 1.05
) -> tuple[Tensor, dict[str, float]]:
    """SAPO (docs/algorithms.md §11): λ = −(4/τ)·σ(τ(ρ − 1))·A, τ = tau_pos if A > 0 else tau_neg.

    A smooth gate instead of a hard clip. ρ keeps its gradient: ∇λ = −A·4σ(1 − σ)·ρ·∇ℓ, the plain policy
    gradient at ρ = 1 and smoothly smaller away from it (faster for the larger τ_neg, which damps
    negative-advantage tokens more). −sg[f]·A·ℓ would be a different update. Aggregation:
    seq-mean-token-mean (the paper's).
    """
    if not 0 < tau_pos <= tau_neg:
        raise ValueError(f"sapo needs 0 < tau_pos <= tau_neg, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    mask, adv = inputs.mask, inputs.advantages
    ratio = token_log_ratio(inputs).exp()
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * adv
    with torch.no_grad():
        metrics = {
            "policy/ratio_mean": float(masked_mean(ratio, mask)),
            "sapo/gate_weight_mean": float(masked_mean(4.0 * gate * (1.0 - gate), mask)),
        }
    return torch.where(mask, loss, 0.0), metrics


@POLICY_LOSS_FNS.register("sppo")
def sppo(inputs: PolicyLossInputs, *, epsilon: float = 0.3) -> tuple[Tensor, dict[str, float]]:
    """sPPO (docs/algorithms.md §13): λ = −A·log clip(ρ, 1/(1 + ε), 1 + ε).

    Gradient −A∇ℓ inside the band and 0 outside it, whatever the sign of A (PPO's clip is one-sided per
    sign). Clamping log ρ to ±log(1 + ε) is the same function with no exp. Aggregation: token-mean.
    """
    if not epsilon > 0:
        raise ValueError(f"sppo needs epsilon > 0 (band [1/(1+ε), 1+ε]), got {epsilon}")
    mask = inputs.mask
    log_ratio = token_log_ratio(inputs)
    bound = math.log1p(epsilon)
    loss = -inputs.advantages * log_ratio.clamp(-bound, bound)
    with torch.no_grad():
        metrics = {
            "policy/clip_fraction": float(masked_mean((log_ratio.abs() > bound).float(), mask)),
            "policy/approx_kl": float(masked_mean(-log_ratio, mask)),
        }
    return torch.where(mask, loss, 0.0), metrics


def token_log_ratio(inputs: PolicyLossInputs) -> Tensor:
    """log ρ = ℓ − ℓold, clamped to [−20, 20] (§0.2), differentiable in ℓ."""
    return (inputs.logprobs - inputs.old_logprobs).clamp(-20.0, 20.0)
