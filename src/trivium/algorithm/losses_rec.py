"""The REC family (docs/algorithms.md §15): group-relative REINFORCE with a clip mask, a weight and a regulariser.

λ_{i,t} = −M_{i,t}·W_{i,t}·A_{i,t}·ℓ_{i,t} + Reg_{i,t}, with M and W computed from detached ratios.

Design decision: one parameterised loss rather than one registered name per member, because the
members differ only in three independent choices (``clip_mode``, ``weight``, ``regulariser``); a preset
names the member by its args. Named members (args beyond the defaults):

- REINFORCE: clip_mode="none".                 - REC-OneSide-NoIS: the defaults.
- REC-OneSide-IS: weight="is" (with std-normalised A its gradient is GRPO's PPO-clip gradient).
- REC-TwoSide-IS / -NoIS: clip_mode="two-side" (weight="is" / "none").
- REC-Ring-NoIS: clip_mode="ring" (ε = 0.2, ε' = 0.6 / 2.0).
- REC-GSPO-NoIS / -IS: clip_mode="gspo-one-side", clip_low=3e-4, clip_high=4e-4 (weight "none" /
  "gspo-is"); these need seq-mean-token-mean, every other member token-mean.
- AsymRE (§14): clip_mode="none", regulariser="forward-kl", reg_coef=0.1. OPMD: regulariser="k2".
- RED-Weight: weight="advantage" (W = exp(A/τ)).

The value holds ℓ, so only the gradient is meaningful. Left out: RED-Drop, which reshapes the data
(an advantage/data-side choice, not a loss).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trivium.algorithm.aggregation import masked_mean
from trivium.algorithm.losses_sequence import sequence_mean, to_tokens
from trivium.algorithm.policy_losses import PolicyLossInputs, token_log_ratio
from trivium.algorithm.registry import POLICY_LOSS_FNS

__all__ = ["CLIP_MODES", "REGULARISERS", "WEIGHTS", "rec", "rec_clip_mask"]

CLIP_MODES = ("none", "one-side", "two-side", "ring", "gspo-one-side")
WEIGHTS = ("none", "is", "gspo-is", "advantage")
REGULARISERS = ("none", "forward-kl", "k2")


def rec_clip_mask(
    ratio: Tensor,
    adv: Tensor,
    clip_mode: str,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ring_low: float = 0.6,
    ring_high: float = 2.0,
) -> Tensor:
    """M (bool, same shape as ``ratio``) from detached ratios ρ̄ and advantages A.

    one-side keeps PPO's non-zero-gradient region: (A ≥ 0 and ρ̄ ≤ 1 + ε_high) or (A ≤ 0 and
    ρ̄ ≥ 1 − ε_low). two-side keeps the band 1 − ε_low ≤ ρ̄ ≤ 1 + ε_high. ring keeps the band plus the
    far side where the update is corrective: (A ≥ 0 and ρ̄ ≤ 1 − ε'_low) or (A ≤ 0 and ρ̄ ≥ 1 + ε'_high).
    For "gspo-one-side" pass the sequence ratio s_i per token as ``ratio``.
    """
    band = (ratio >= 1.0 - clip_low) & (ratio <= 1.0 + clip_high)
    if clip_mode == "none":
        return torch.ones_like(band)
    if clip_mode in ("one-side", "gspo-one-side"):
        return ((adv >= 0) & (ratio <= 1.0 + clip_high)) | ((adv <= 0) & (ratio >= 1.0 - clip_low))
    if clip_mode == "two-side":
        return band
    if clip_mode == "ring":
        return band | ((adv >= 0) & (ratio <= 1.0 - ring_low)) | ((adv <= 0) & (ratio >= 1.0 + ring_high))
    raise ValueError(f"rec clip_mode {clip_mode!r} is not one of {', '.join(CLIP_MODES)}")


@POLICY_LOSS_FNS.register("rec")
def rec(
    inputs: PolicyLossInputs,
    *,
    clip_mode: str = "one-side",
    weight: str = "none",
    regulariser: str = "none",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ring_low: float = 0.6,
    ring_high: float = 2.0,
    tau: float = 1.0,
    reg_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """REC loss (see the module docstring). Aggregation: token-mean; seq-mean-token-mean for gspo-one-side.

    ``weight``: "none" W = 1, "is" W = ρ̄, "gspo-is" W = sg[s_i] (§9's sequence ratio), "advantage"
    W = exp(A/τ) with τ = ``tau``. ``regulariser`` (not masked by M): "forward-kl" Reg = −c·ℓ (AsymRE),
    "k2" Reg = c·(ℓ − ℓold)² (OPMD; the ½ absorbed into c), with c = ``reg_coef``. ``ring_low`` /
    ``ring_high`` are ε'_low / ε'_high of the ring mask.
    """
    _check_rec_args(clip_mode, weight, regulariser, clip_low, clip_high, ring_low, ring_high, tau, reg_coef)
    mask, adv, lp = inputs.mask, inputs.advantages, inputs.logprobs
    log_ratio = token_log_ratio(inputs)
    with torch.no_grad():
        ratio = log_ratio.exp()
        seq_ratio = None
        if clip_mode == "gspo-one-side" or weight == "gspo-is":
            log_s = sequence_mean(log_ratio, mask, inputs.seq_index)
            seq_ratio = to_tokens(log_s.clamp(max=10.0).exp(), inputs.seq_index)
        keep = rec_clip_mask(
            seq_ratio if clip_mode == "gspo-one-side" else ratio,
            adv,
            clip_mode,
            clip_low=clip_low,
            clip_high=clip_high,
            ring_low=ring_low,
            ring_high=ring_high,
        )
        w = {
            "none": lambda: torch.ones_like(ratio),
            "is": lambda: ratio,
            "gspo-is": lambda: seq_ratio,
            "advantage": lambda: torch.exp(adv / tau),
        }[weight]()
        metrics = {
            "policy/clip_fraction": float(masked_mean((~keep).float(), mask)),
            "policy/ratio_mean": float(masked_mean(ratio, mask)),
            "rec/weight_mean": float(masked_mean(w, mask)),
        }
    loss = -(keep * w * adv) * lp
    if regulariser == "forward-kl":
        loss = loss - reg_coef * lp
    elif regulariser == "k2":
        loss = loss + reg_coef * log_ratio.square()
    return torch.where(mask, loss, 0.0), metrics


def _check_rec_args(clip_mode, weight, regulariser, clip_low, clip_high, ring_low, ring_high, tau, reg_coef):
    for name, value, valid in (
        ("clip_mode", clip_mode, CLIP_MODES),
        ("weight", weight, WEIGHTS),
        ("regulariser", regulariser, REGULARISERS),
    ):
        if value not in valid:
            raise ValueError(f"rec {name}={value!r} is not one of: {', '.join(valid)}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"rec needs clip_low, clip_high >= 0, got {clip_low}, {clip_high}")
    if clip_mode == "ring" and not (ring_low >= clip_low and ring_high >= clip_high):
        raise ValueError(
            f"rec ring bounds must lie outside the band: ring_low={ring_low} >= clip_low={clip_low} and "
            f"ring_high={ring_high} >= clip_high={clip_high} (paper: 0.6 and 2.0 with 0.2)"
        )
    if not tau > 0:
        raise ValueError(f"rec tau must be > 0 (W = exp(A/tau)), got {tau}")
    if reg_coef < 0:
        raise ValueError(f"rec reg_coef must be >= 0, got {reg_coef}")
    if (regulariser == "none") != (reg_coef == 0):
        raise ValueError(
            f"rec regulariser={regulariser!r} with reg_coef={reg_coef} has no effect: set both "
            f"(e.g. regulariser='forward-kl', reg_coef=0.1 for AsymRE) or neither"
        )
