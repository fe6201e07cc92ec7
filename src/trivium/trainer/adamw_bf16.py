"""AdamW with its two moments kept in bfloat16: half of AdamW's optimizer state (``trainer.optimizer_state_dtype``).

The weights stay float32 and the update is AdamW's, computed in float32: per parameter, the moments are
read into float32, updated, used, and written back rounded to bfloat16. A bf16 number has 8 significant
bits, so rounding to nearest would lose the second moment's small updates: with beta2 = 0.999 a step moves
it by ~0.1% of itself, below bf16's resolution (0.4-0.8%), and it would stay stuck where it started. The
moments are therefore rounded *stochastically* (up with the probability of the distance to the lower
neighbour), which is exact in expectation; the same idea as AnyPrecisionAdamW's bf16 moments and low-bit
optimizers (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"; Zamirai et al. 2020,
"Revisiting BFloat16 Training", on stochastic rounding). The rounding noise comes from a generator
seeded from (seed, step), so a resumed run draws exactly what an uninterrupted one draws.

Memory: 4 bytes a trainable parameter instead of 8 (1 GB less per 250M parameters); the cost is a Python
loop over the parameters with float32 temporaries of one parameter at a time (slower than the fused fp32
kernel: ``benchmarks/optimizer.py`` measures it). Single-rank and DDP only: check-config refuses it under
FSDP2, whose sharded parameters this optimizer does not handle yet.
"""

from __future__ import annotations

import math

import torch

__all__ = ["Bf16StateAdamW", "rounding_noise", "stochastic_round_to_bf16"]


def rounding_noise(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Uniform integers in [0, 2^16), one per element of ``like``: what ``stochastic_round_to_bf16`` adds."""
    return torch.randint(0, 1 << 16, like.shape, generator=generator, device=like.device, dtype=torch.int32)


def stochastic_round_to_bf16(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to bfloat16, up or down with probabilities that make it exact in expectation.

    bf16 is float32's upper 16 bits: adding a uniform random integer in [0, 2^16) (``noise``, from
    ``rounding_noise``) to the low 16 bits of the bit pattern and dropping them rounds the magnitude up
    exactly when the noise carries over, which happens with probability (low bits) / 2^16. Sign-magnitude
    makes it symmetric for negative numbers."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


class Bf16StateAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias correction) with ``exp_avg`` and
    ``exp_avg_sq`` stored in bfloat16 by stochastic rounding (module docstring). ``seed`` seeds the rounding."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, seed: int = 0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed

    def load_state_dict(self, state_dict: dict) -> None:
        """torch casts loaded moments to the parameters' dtype (float32): back to bf16 here, so a state
        written by the float32 AdamW loads too."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("Bf16StateAdamW takes no closure")
        generators: dict[torch.device, torch.Generator] = {}
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                grad = p.grad.float()
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = int(state["step"].item())
                gen = generators.get(p.device)
                if gen is None:  # one stream per step: a resumed run draws what an uninterrupted one drew
                    gen = generators[p.device] = torch.Generator(p.device)
                    gen.manual_seed(self.seed * 1_000_003 + t)
                m = state["exp_avg"].float().lerp_(grad, 1 - beta1)
                v = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if decay:
                    p.mul_(1 - lr * decay)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))
                # one draw for both moments: each is still rounded exactly in expectation, and the random
                # numbers (torch's CPU generator runs on one thread) are most of this update's cost
                noise = rounding_noise(m, gen)
                state["exp_avg"].copy_(stochastic_round_to_bf16(m, noise))
                state["exp_avg_sq"].copy_(stochastic_round_to_bf16(v, noise))
        return None
