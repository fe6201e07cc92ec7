"""An algorithm as the trainer runs it: the preset's parts with the user's overrides applied."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trivium.algorithm import ADVANTAGE_FNS, get_preset
from trivium.config.schema import AlgorithmConfig

__all__ = ["AlgorithmSpec"]


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm preset with the user's overrides applied: the parts the trainer calls."""

    name: str
    advantage_fn: str | None
    advantage_args: dict[str, Any] = field(default_factory=dict)
    policy_loss_fn: str = "ppo_clip"
    policy_loss_args: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    needs_old_logprobs: bool = True  # False for offline losses (SFT): skips a forward pass per step
    advantage_requires: frozenset[str] = frozenset()  # optional AdvantageInputs the advantage reads
    entropy_coef: float = 0.0
    rollout_is_cap: float = 0.0  # truncated IS for the sampling policy (0 = off)

    @classmethod
    def from_config(cls, cfg: AlgorithmConfig) -> AlgorithmSpec:
        preset = get_preset(cfg.algorithm_type)
        adv = cfg.advantage_fn or preset.advantage_fn
        loss = cfg.policy_loss_fn or preset.policy_loss_fn
        critic_args = {"gamma": cfg.critic.gamma, "lam": cfg.critic.lam} if preset.needs_critic else {}
        return cls(
            name=preset.name,
            advantage_fn=adv,
            advantage_args={**preset.args_for("advantage", adv), **critic_args, **cfg.advantage_args},
            policy_loss_fn=loss,
            policy_loss_args={**preset.args_for("policy_loss", loss), **cfg.policy_loss_args},
            aggregation=cfg.loss_agg_mode or preset.aggregation,
            kl_coef=cfg.kl_loss.coef,
            kl_estimator=cfg.kl_loss.estimator,
            needs_old_logprobs=preset.needs_rollouts,
            advantage_requires=frozenset(getattr(ADVANTAGE_FNS.get(adv), "requires", ()))
            if adv
            else frozenset(),
            entropy_coef=cfg.entropy_coef,
            rollout_is_cap=cfg.rollout_is_cap or 0.0,  # None: launch/rollout_correction.py decides
        )
