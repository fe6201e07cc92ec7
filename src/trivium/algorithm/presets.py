"""Algorithms as named bundles of registered parts: data, not classes.

A preset says which advantage function, policy loss and aggregation make up an algorithm, with their
arguments, and what data it needs. The config layer starts from a preset and may override any field;
``tests/algorithm`` checks that every part a preset names is registered.

Coefficients that a user tunes per run (kl_coef, the max response length C) live in the config, not here:
a preset only names the KL estimator to use when the config turns the KL term on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trivium.algorithm.registry import UnknownPartError

__all__ = ["PRESETS", "AlgorithmPreset", "get_preset"]


@dataclass(frozen=True)
class AlgorithmPreset:
    name: str
    advantage_fn: str | None  # None: no advantages (offline SFT)
    policy_loss_fn: str
    aggregation: str
    needs_rollouts: bool  # False: trains on a fixed data set (offline)
    needs_reference: bool  # a reference model is needed even with kl_coef = 0
    description: str
    policy_loss_args: Mapping[str, Any] = field(default_factory=dict)
    advantage_args: Mapping[str, Any] = field(default_factory=dict)
    kl_estimator: str | None = None  # used when the config sets kl_coef > 0

    def __post_init__(self) -> None:  # presets are shared constants: make their args read-only too
        object.__setattr__(self, "policy_loss_args", MappingProxyType(dict(self.policy_loss_args)))
        object.__setattr__(self, "advantage_args", MappingProxyType(dict(self.advantage_args)))


PRESETS: dict[str, AlgorithmPreset] = {
    p.name: p
    for p in [
        AlgorithmPreset(
            name="grpo",
            advantage_fn="grpo",
            advantage_args={"std_normalize": True, "epsilon": 1e-6},
            policy_loss_fn="ppo_clip",
            policy_loss_args={"clip_low": 0.2, "clip_high": 0.2},
            aggregation="token-mean",
            kl_estimator="k3",
            needs_rollouts=True,
            needs_reference=False,
            description=(
                "GRPO (arXiv:2402.03300): group-normalised outcome advantage, PPO clip 0.2, token-mean "
                "(the paper's seq-mean-token-mean is one override away); KL to the reference (k3) only "
                "when kl_coef > 0."
            ),
        ),
        AlgorithmPreset(
            name="sft",
            advantage_fn=None,
            policy_loss_fn="sft",
            aggregation="token-mean",
            needs_rollouts=False,
            needs_reference=False,
            description="Supervised fine-tuning: masked negative log-likelihood of the target tokens.",
        ),
    ]
}


def get_preset(name: str) -> AlgorithmPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPartError(
            f"Unknown algorithm {name!r}. Valid algorithms: {', '.join(sorted(PRESETS))}"
        ) from None
