"""CHORD (docs/algorithms.md §16): one loss over a batch that mixes on-policy rollouts U and expert data E.

L = (1 − μ)·L_RL(U) + μ·L_SFT(E), L_RL = PPO clip with the given (GRPO) advantages, token-mean over U;
L_SFT = −Σ_E m φ ℓ / Σ_E m, token-mean over E.

Design decisions:
- Each part is a token-mean within its own subset of the whole optimiser mini-batch. The loss returns
  λ = (1 − μ)·λ_PPO on U and μ·φ·(−ℓ) on E, and the ``chord`` aggregation mode divides U tokens by |U|
  and E tokens by |E| (``LossScale.num_expert_tokens``, from ``loss_scale(..., is_expert=...)``). Plain
  token-mean would divide both by |U| + |E| and so re-weight the parts by their token shares.
- The reference implementations rescale each part by (samples of the part in the micro-batch) /
  (configured samples of the part per step), so that a part is a mean over its batch whatever the
  micro-batching. The mini-batch-wide denominators do that exactly (also when micro-batches differ in
  tokens per sample), so there is no separate rescaling here.
- CHORD-μ: μ scheduled from ``inputs.step`` (``chord_mu``), φ ≡ 1. CHORD-φ: constant ``mu`` (0.1) and
  ``phi=True``, φ = sg[p(1 − p)], p = exp(ℓ): tokens the model finds certain or impossible weigh little.

Left out: the "SFT-IS" ablation (φ = sg[p]).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from trivium.algorithm.aggregation import masked_mean
from trivium.algorithm.policy_losses import PolicyLossInputs, ppo_clip
from trivium.algorithm.registry import POLICY_LOSS_FNS

__all__ = ["chord", "chord_mu"]


def chord_mu(step: int, *, warmup_steps: int, decay_steps: int, mu_peak: float, mu_valley: float) -> float:
    """CHORD-μ's weight of the SFT part at global step k: linear warm-up to μ_peak over ``warmup_steps``,
    cosine decay to μ_valley over ``decay_steps``, then μ_valley.

    Reference settings (0, 200, 0.9, 0.05) give 0.9, 0.7755204, 0.475, 0.05 at k = 0, 50, 100, 200.
    """
    if step < 0 or warmup_steps < 0 or decay_steps < 0:
        raise ValueError(
            f"chord_mu needs step, warmup_steps, decay_steps >= 0, got {step}, {warmup_steps}, {decay_steps}"
        )
    if not (0 <= mu_peak <= 1 and 0 <= mu_valley <= 1):
        raise ValueError(f"chord_mu needs mu_peak, mu_valley in [0, 1], got {mu_peak}, {mu_valley}")
    if step < warmup_steps:
        return mu_peak * step / warmup_steps
    if step < warmup_steps + decay_steps:
        progress = (step - warmup_steps) / decay_steps
        return mu_valley + (mu_peak - mu_valley) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return mu_valley


@POLICY_LOSS_FNS.register("chord")
def chord(
    inputs: PolicyLossInputs,
    *,
    mu: float | None = None,
    warmup_steps: int = 0,
    decay_steps: int = 200,
    mu_peak: float = 0.9,
    mu_valley: float = 0.05,
    phi: bool = False,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[Tensor, dict[str, float]]:
    """CHORD's λ (module docstring). Aggregation: **chord** (token-mean within U and within E).

    ``mu`` None: μ = ``chord_mu(inputs.step, ...)`` (CHORD-μ); a number: constant μ (CHORD-φ uses 0.1).
    ``phi``: weight expert tokens by φ = sg[p(1 − p)]. Needs ``inputs.is_expert``; the RL part uses
    ``inputs.advantages`` (0 on expert tokens is fine, they are not read there).
    """
    if inputs.is_expert is None:
        raise ValueError(
            "chord needs inputs.is_expert ([R, L] bool, True on expert-demonstration tokens); set it from "
            "each sequence's expert flag, or use ppo_clip for a batch without expert data"
        )
    if inputs.is_expert.shape != inputs.mask.shape or inputs.is_expert.dtype != torch.bool:
        raise ValueError(
            f"chord needs inputs.is_expert as a bool tensor of the mask's shape {tuple(inputs.mask.shape)}, "
            f"got {inputs.is_expert.dtype} {tuple(inputs.is_expert.shape)}"
        )
    if mu is None:
        weight = chord_mu(
            inputs.step,
            warmup_steps=warmup_steps,
            decay_steps=decay_steps,
            mu_peak=mu_peak,
            mu_valley=mu_valley,
        )
    elif 0 <= mu <= 1:
        weight = float(mu)
    else:
        raise ValueError(f"chord mu must be in [0, 1] (or None to schedule it), got {mu}")
    mask, expert = inputs.mask, inputs.is_expert
    rl_mask, sft_mask = mask & ~expert, mask & expert
    rl, metrics = ppo_clip(dataclasses.replace(inputs, mask=rl_mask), clip_low=clip_low, clip_high=clip_high)
    nll = -inputs.logprobs
    if phi:
        with torch.no_grad():
            p = inputs.logprobs.exp()
            token_weight = p * (1.0 - p)
        nll = token_weight * nll
        metrics["chord/phi_mean"] = float(masked_mean(token_weight, sft_mask))
    loss = torch.where(expert, weight * nll, (1.0 - weight) * rl)
    with torch.no_grad():
        metrics["chord/mu"] = weight
        metrics["chord/expert_token_fraction"] = float(masked_mean(expert.float(), mask))
        metrics["chord/sft_nll"] = float(masked_mean(-inputs.logprobs, sft_mask))
    return torch.where(mask, loss, 0.0), metrics
