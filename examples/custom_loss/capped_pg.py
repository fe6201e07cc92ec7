"""A user-defined policy loss, kept outside the trivium package: see docs/algorithms.md.

Capped importance-weighted policy gradient: λ = −sg[min(ρ, cap)] · A · ℓ. The weight corrects for
off-policy samples but never exceeds ``cap``, and no token is ever dropped (unlike PPO's clip).
"""

import torch

from trivium.algorithm import PolicyLossInputs


def capped_pg(inputs: PolicyLossInputs, *, cap: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    if cap <= 0:
        raise ValueError(f"capped_pg: cap must be > 0, got {cap}")
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-20, 20)
    weight = torch.exp(log_ratio).clamp(max=cap).detach()
    loss = -weight * inputs.advantages * inputs.logprobs
    mask = inputs.mask
    capped = ((torch.exp(log_ratio) > cap) & mask).sum() / mask.sum().clamp(min=1)
    return torch.where(mask, loss, 0.0), {"capped_pg/capped_fraction": float(capped)}
