"""Per-token KL estimators of KL(π ‖ π_ref) from one sampled token (docs/algorithms.md §2.1).

With δ = ℓ − ℓref: k1 = δ (unbiased, can be negative, zero expected gradient as a loss), k2 = ½δ²
(biased, ≥ 0, gradient δ∇ℓ), k3 = e^{−δ} + δ − 1 (unbiased, ≥ 0, the GRPO paper's choice; alias
"low_var_kl"), abs = |δ|. Each returns ``[R, L]`` for every position; masking happens in the aggregation.

Guard (§2.1b): for k3, δ is clamped to [−20, 20] before exp and the value to [−10, 10]; the gradient is
zero where a clamp is active. That only happens when policy and reference have drifted far apart.

Left out: the straight-through variants (k3's value with k2's gradient) until a preset needs one.
"""

from __future__ import annotations

from torch import Tensor

from trivium.algorithm.registry import KL_FNS

__all__ = ["k1", "k2", "k3", "kl_abs"]


@KL_FNS.register("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


@KL_FNS.register("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_FNS.register("k3")
@KL_FNS.register("low_var_kl")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)  # log(π_ref/π) = −δ
    return (log_ratio.exp() - log_ratio - 1.0).clamp(-10.0, 10.0)


@KL_FNS.register("abs")
def kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return (logprobs - ref_logprobs).abs()
