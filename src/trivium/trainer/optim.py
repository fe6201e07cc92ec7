"""AdamW and the learning-rate schedule (linear warm-up, then constant, cosine or linear decay)."""

from __future__ import annotations

import math

import torch

from trivium.config.schema import TrainerConfig


def build_optimizer(params, cfg: TrainerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [p for p in params if p.requires_grad],
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=1e-8,
        weight_decay=cfg.weight_decay,
    )


def lr_factor(step: int, total: int, cfg: TrainerConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based) of ``total``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_scheduler == "constant":
        return 1.0
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    if cfg.lr_scheduler == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return floor + (1 - floor) * (1 - progress)


def build_scheduler(optimizer: torch.optim.Optimizer, total: int, cfg: TrainerConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, cfg))
