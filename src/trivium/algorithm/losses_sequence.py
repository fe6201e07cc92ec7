"""Policy losses built on sequence-level importance ratios: GSPO (§9), TOPR (§12), PPO's sequence form (§7).

Design decisions:
- A sequence ratio needs a sum over the sequence's valid tokens. It is taken inside the micro-batch with
  ``seq_index`` (packed rows hold several sequences), which is exact because a sequence is never split
  across micro-batches.
- Each loss still returns per-token λ ``[R, L]``; its docstring names the aggregation mode under which
  the aggregated loss is the paper's formula, in value and in gradient. The preset must use that mode.
- GSPO uses the paper's token form (sequence ratio in value, token gradient) so per-token advantages
  work; TOPR detaches its sequence weight, so its λ is plain REINFORCE per token; the sequence PPO form
  broadcasts the differentiable per-sequence loss to every token of the sequence.

Left out: length-normalised TOPR and a sequence-level KL; neither is in the papers' main recipes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trivium.algorithm.aggregation import masked_mean, sequence_sums
from trivium.algorithm.policy_losses import PolicyLossInputs, token_log_ratio
from trivium.algorithm.registry import POLICY_LOSS_FNS

__all__ = ["gspo", "ppo_seq", "sequence_mean", "to_tokens", "topr", "topr_token"]


def sequence_mean(values: Tensor, mask: Tensor, seq_index: Tensor, *, mean: bool = True) -> Tensor:
    """Per-sequence mean (or, with ``mean=False``, sum) of ``values [R, L]`` over ``mask``: ``[S]``.

    S = max sequence id + 1 of this micro-batch; a sequence without valid tokens gets 0. Differentiable.
    """
    num_seqs = int(seq_index.max().clamp(min=-1)) + 1 if seq_index.numel() else 0
    sums = sequence_sums(values, mask, seq_index, num_seqs)
    if not mean:
        return sums
    counts = sequence_sums(torch.ones_like(values), mask, seq_index, num_seqs)
    return sums / counts.clamp(min=1.0)


def to_tokens(per_seq: Tensor, seq_index: Tensor) -> Tensor:
    """Each token's entry of ``per_seq [S]``: ``[R, L]`` (padding gets sequence 0's; mask it)."""
    if per_seq.numel() == 0:  # no sequence in this micro-batch: every token is padding
        return torch.zeros(seq_index.shape, dtype=per_seq.dtype, device=per_seq.device)
    return per_seq[seq_index.clamp(min=0)]


@POLICY_LOSS_FNS.register("gspo")
def gspo(
    inputs: PolicyLossInputs, *, clip_low: float = 3e-4, clip_high: float = 4e-4
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (docs/algorithms.md §9), token form. Aggregation: **seq-mean-token-mean** (mandatory).

    s_i = exp((1/n_i) Σ_t m (ℓ − ℓold)), the geometric mean of the token ratios. Each token carries
    log s_{i,t} = sg[log s_i] + ℓ_{i,t} − sg[ℓ_{i,t}] (value log s_i, gradient ∇ℓ_{i,t}) and
    λ_{i,t} = −min(s_{i,t}A_{i,t}, clip(s_{i,t}, 1 − clip_low, 1 + clip_high)A_{i,t}). Under
    seq-mean-token-mean and A_{i,t} = A_i this is (1/N) Σ_i −min(s_i A_i, clip(s_i)A_i) in value and
    gradient (∇s_i = s_i·(1/n_i)Σ_t∇ℓ); other modes change the objective. Clipping acts per response:
    when it triggers, all its tokens get zero gradient. log s_{i,t} is clamped to ≤ 10 before exp.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(
            f"gspo needs clip_low, clip_high >= 0 (paper: 3e-4, 4e-4), got {clip_low}, {clip_high}"
        )
    mask, adv, lp = inputs.mask, inputs.advantages, inputs.logprobs
    log_s = to_tokens(
        sequence_mean(token_log_ratio(inputs).detach(), mask, inputs.seq_index), inputs.seq_index
    )
    ratio = (log_s + lp - lp.detach()).clamp(max=10.0).exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {
            "policy/clip_fraction": float(masked_mean((clipped > unclipped).float(), mask)),
            "policy/ratio_mean": float(masked_mean(ratio, mask)),  # token-weighted mean of s_i
            "policy/approx_kl": float(masked_mean(-log_s, mask)),
        }
    return torch.where(mask, loss, 0.0), metrics


@POLICY_LOSS_FNS.register("topr")
def topr(inputs: PolicyLossInputs, *, threshold: float = 0.0) -> tuple[Tensor, dict[str, float]]:
    """TOPR (docs/algorithms.md §12), the paper's sequence form. Aggregation: **seq-mean-token-sum**.

    ρ_i = exp(Σ_t m (ℓ − ℓold)) (a sequence probability ratio, not length-normalised),
    α_i = 1 if A ≥ threshold else clip(ρ_i, 0, 1), λ_{i,t} = −sg[α_i]·A_{i,t}·ℓ_{i,t}; then
    (1/N) Σ_i Σ_t λ_{i,t} = (1/N) Σ_i −sg[α_i]·A_i·Σ_t ℓ_{i,t}. Positive samples are learnt like SFT,
    negative ones with the truncated ratio, so a sequence the policy already avoids stops being pushed
    down. A is the (shifted) reward given in ``inputs.advantages``; the sign test is per token, which is
    per sequence for outcome advantages. The value holds ℓ: only its gradient is meaningful.
    """
    mask, adv = inputs.mask, inputs.advantages
    with torch.no_grad():
        seq_log_ratio = sequence_mean(token_log_ratio(inputs), mask, inputs.seq_index, mean=False)
        ratio = to_tokens(seq_log_ratio.clamp(-20.0, 20.0).exp(), inputs.seq_index)
        alpha, metrics = _taper(ratio, adv, mask, threshold)
    return torch.where(mask, -alpha * adv * inputs.logprobs, 0.0), metrics


@POLICY_LOSS_FNS.register("topr_token")
def topr_token(inputs: PolicyLossInputs, *, threshold: float = 0.0) -> tuple[Tensor, dict[str, float]]:
    """TOPR with per-token ratios α_{i,t} = clip(ρ_{i,t}, 0, 1) on negatives. Aggregation: token-mean.

    Cheaper and lower-variance than ``topr`` but not the paper's estimator (§12): a named variant.
    """
    mask, adv = inputs.mask, inputs.advantages
    with torch.no_grad():
        alpha, metrics = _taper(token_log_ratio(inputs).exp(), adv, mask, threshold)
    return torch.where(mask, -alpha * adv * inputs.logprobs, 0.0), metrics


@POLICY_LOSS_FNS.register("ppo_seq")
def ppo_seq(
    inputs: PolicyLossInputs, *, clip_low: float = 0.2, clip_high: float = 0.2
) -> tuple[Tensor, dict[str, float]]:
    """PPO clip on the sequence ratio, RLOO's sequence form (docs/algorithms.md §7). Aggregation:
    **seq-mean-token-mean**.

    ρ_i = exp(Σ_t m (ℓ − ℓold)) (not length-normalised), A_i = mean of A over the sequence's valid
    tokens, λ_i = −min(ρ_i A_i, clip(ρ_i, 1 − clip_low, 1 + clip_high) A_i), copied onto each of its
    tokens with its full gradient; seq-mean-token-mean then gives (1/N) Σ_i λ_i in value and gradient
    (on-policy: −A_i Σ_t ∇ℓ_{i,t}, sequence-level REINFORCE).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"ppo_seq needs clip_low, clip_high >= 0, got {clip_low}, {clip_high}")
    mask, seq_index = inputs.mask, inputs.seq_index
    log_ratio = sequence_mean(token_log_ratio(inputs), mask, seq_index, mean=False).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    adv = sequence_mean(inputs.advantages, mask, seq_index)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        present = sequence_mean(torch.ones_like(inputs.logprobs), mask, seq_index, mean=False) > 0
        metrics = {
            "policy/clip_fraction": float(masked_mean((clipped > unclipped).float(), present)),
            "policy/ratio_mean": float(masked_mean(ratio, present)),
            "policy/approx_kl": float(masked_mean(-log_ratio, present)),
        }
    return torch.where(mask, to_tokens(loss, seq_index), 0.0), metrics


def _taper(ratio: Tensor, adv: Tensor, mask: Tensor, threshold: float) -> tuple[Tensor, dict[str, float]]:
    negative = adv < threshold
    alpha = torch.where(negative, ratio.clamp(max=1.0), 1.0)
    metrics = {
        "topr/negative_fraction": float(masked_mean(negative.float(), mask)),
        "topr/negative_alpha_mean": float(masked_mean(alpha, mask & negative)),
    }
    return alpha, metrics
