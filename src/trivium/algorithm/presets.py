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

from trivium.registry import Registry, instance_of

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
    offline_data: str | None = None  # "sft" or "preference": what a train-mode stage reads
    needs_teacher: bool = False  # teacher log-probs of the sampled tokens (distillation)
    needs_critic: bool = False  # a value model trained alongside (PPO)
    sample_strategy: str = "default"  # what a train batch is made of (trivium.buffer.sampling)

    def args_for(self, part: str, name: str | None) -> dict[str, Any]:
        """The preset's arguments for ``part`` ("advantage" or "policy_loss") when ``name`` is the preset's
        own function; none when the user swapped in another function (its defaults apply instead)."""
        own, args = {
            "advantage": (self.advantage_fn, self.advantage_args),
            "policy_loss": (self.policy_loss_fn, self.policy_loss_args),
        }[part]
        return dict(args) if name == own else {}

    def __post_init__(self) -> None:  # presets are shared constants: make their args read-only too
        object.__setattr__(self, "policy_loss_args", MappingProxyType(dict(self.policy_loss_args)))
        object.__setattr__(self, "advantage_args", MappingProxyType(dict(self.advantage_args)))


def _rl(name: str, advantage: str, loss: str, description: str, **kw: Any) -> AlgorithmPreset:
    """An online RL preset; token-mean and the k3 KL estimator unless told otherwise."""
    kw.setdefault("aggregation", "token-mean")
    kw.setdefault("kl_estimator", "k3")
    return AlgorithmPreset(
        name=name,
        advantage_fn=advantage,
        policy_loss_fn=loss,
        needs_rollouts=True,
        needs_reference=kw.pop("needs_reference", False),
        description=description,
        **kw,
    )


_CLIP = {"clip_low": 0.2, "clip_high": 0.2}

_BUILTIN = [
    _rl(
        "grpo",
        "grpo",
        "ppo_clip",
        "GRPO (arXiv:2402.03300): group-normalised outcome advantage, PPO clip "
        "0.2, token-mean (the paper's seq-mean-token-mean is one override away); KL (k3) when kl_coef > 0.",
        advantage_args={"std_normalize": True, "epsilon": 1e-6},
        policy_loss_args=_CLIP,
    ),
    _rl(
        "step_wise_grpo",
        "step_wise_grpo",
        "ppo_clip",
        "Step-wise GRPO for multi-turn agents (one experience per model turn): GRPO's advantage computed "
        "over the task's episodes, each turn getting its return's advantage; PPO clip 0.2, token-mean.",
        advantage_args={"std_normalize": True, "epsilon": 1e-6},
        policy_loss_args=_CLIP,
    ),
    _rl(
        "gigpo",
        "gigpo",
        "ppo_clip",
        "GiGPO (arXiv:2505.10978) for multi-turn agents (workflow step_wise): each turn's advantage is its "
        "episode's GRPO advantage plus a step-level one among the group's turns taken from the same "
        "environment state (ω = 1); PPO clip 0.2, token-mean.",
        advantage_args={"step_weight": 1.0, "std_normalize": True, "epsilon": 1e-6},
        policy_loss_args=_CLIP,
    ),
    _rl(
        "dr_grpo",
        "grpo",
        "ppo_clip",
        "Dr. GRPO (arXiv:2503.20783): no std division, no length "
        "normalisation (seq-mean-token-sum-norm with C = max response length).",
        advantage_args={"std_normalize": False},
        policy_loss_args=_CLIP,
        aggregation="seq-mean-token-sum-norm",
    ),
    _rl(
        "dapo",
        "grpo",
        "ppo_clip",
        "DAPO (arXiv:2503.14476): clip-higher 0.2/0.28, token-level loss, no "
        "KL; turn on algorithm.dynamic_sampling and algorithm.overlong_penalty for the rest of the recipe.",
        advantage_args={"std_normalize": True},
        policy_loss_args={"clip_low": 0.2, "clip_high": 0.28},
    ),
    _rl(
        "ppo",
        "gae",
        "ppo_clip",
        "PPO (arXiv:1707.06347) with a critic: GAE (γ=λ=1 for LLMs), whitened "
        "advantages, PPO clip 0.2, clipped value loss; reward KL penalty via algorithm.kl_penalty.",
        policy_loss_args=_CLIP,
        needs_critic=True,
    ),
    _rl(
        "rloo",
        "rloo",
        "ppo_clip",
        "RLOO (arXiv:2402.14740): leave-one-out baseline, PPO clip (token "
        "form); a sequence-level KL penalty via algorithm.kl_penalty.",
        policy_loss_args=_CLIP,
    ),
    _rl(
        "reinforceplusplus",
        "reinforceplusplus",
        "ppo_clip",
        "REINFORCE++ (arXiv:2501.03262): returns of KL-penalised token rewards, global whitening, PPO clip.",
        policy_loss_args=_CLIP,
    ),
    _rl(
        "reinforceplusplus_baseline",
        "reinforceplusplus_baseline",
        "ppo_clip",
        "REINFORCE++-baseline: R − group mean, global whitening, PPO clip; KL as a loss term (kl_loss).",
        policy_loss_args=_CLIP,
    ),
    _rl(
        "gspo",
        "grpo",
        "gspo",
        "GSPO: sequence-level ratio (length-normalised), clip 3e-4/4e-4, seq-mean-token-mean.",
        advantage_args={"std_normalize": True},
        policy_loss_args={"clip_low": 3e-4, "clip_high": 4e-4},
        aggregation="seq-mean-token-mean",
    ),
    _rl(
        "cispo",
        "grpo",
        "cispo",
        "CISPO: REINFORCE with a stop-gradient, upper-clipped IS weight.",
        advantage_args={"std_normalize": True},
    ),
    _rl(
        "sapo",
        "grpo",
        "sapo",
        "SAPO: a soft, differentiable gate instead of the hard clip.",
        advantage_args={"std_normalize": True},
        aggregation="seq-mean-token-mean",
    ),
    _rl(
        "m2po",
        "grpo",
        "m2po",
        "M2PO (arXiv:2510.01161): for stale samples (an explorer ahead by synchronizer.sync_offset), GRPO's "
        "advantage weighed by the unclipped ratio π/π_rollout to the sampling policy, on the tokens left "
        "after masking the largest (log π_old/π_rollout)² until their mean is at most τ_M2 = 0.04; token-mean.",
        advantage_args={"std_normalize": True},
        policy_loss_args={"m2_threshold": 0.04},
    ),
    _rl(
        "topr",
        "grpo",
        "topr",
        "TOPR (arXiv:2503.14286): positives without IS, negatives with the "
        "sequence ratio truncated to [0, 1]; here on group-relative advantages.",
        advantage_args={"std_normalize": False},
        aggregation="seq-mean-token-sum",
    ),
    _rl(
        "sppo",
        "rec",
        "sppo",
        "sPPO (arXiv:2108.05828): log-ratio surrogate in a two-sided band ε=0.3, group-mean baseline.",
    ),
    _rl(
        "asymre",
        "asymre",
        "rec",
        "AsymRE (arXiv:2506.20520): REINFORCE with the baseline shifted below the group mean (δ_V = −0.1).",
        policy_loss_args={"clip_mode": "none", "weight": "none"},
    ),
    _rl(
        "rec",
        "rec",
        "rec",
        "REC-OneSide-NoIS (arXiv:2509.24203): group-relative REINFORCE with "
        "PPO's one-sided clip used as a mask, no IS weight.",
        policy_loss_args={"clip_mode": "one-side", "weight": "none"},
    ),
    _rl(
        "on_policy_distill",
        "on_policy_distill",
        "is_pg",
        "On-policy distillation: per-token reverse KL "
        "to a teacher (auxiliary model) as the advantage; IS policy gradient.",
        needs_teacher=True,
    ),
    _rl(
        "jsd",
        "jsd_distill",
        "is_pg",
        "JSD distillation (GKD), sampled-token policy-gradient form with "
        "β = 0.5; needs a teacher (auxiliary model).",
        needs_teacher=True,
    ),
    _rl(
        "mix_chord",
        "grpo",
        "chord",
        "CHORD (arXiv:2508.11408): GRPO on rollouts mixed with SFT on expert "
        "demonstrations (buffer.expert_dataset), weighted by a scheduled μ.",
        advantage_args={"std_normalize": True},
        aggregation="chord",
        sample_strategy="mix",
    ),
    AlgorithmPreset(
        name="sft",
        advantage_fn=None,
        policy_loss_fn="sft",
        aggregation="token-mean",
        needs_rollouts=False,
        needs_reference=False,
        offline_data="sft",
        description="Supervised fine-tuning: masked negative log-likelihood of the target tokens.",
    ),
    AlgorithmPreset(
        name="dpo",
        advantage_fn=None,
        policy_loss_fn="sft",  # unused: DPO trains through its own pair loss (trainer/dpo.py)
        aggregation="token-mean",
        needs_rollouts=False,
        needs_reference=True,
        offline_data="preference",
        description="DPO (arXiv:2305.18290): sigmoid preference loss against a frozen reference.",
    ),
]

PRESETS: Registry[AlgorithmPreset] = Registry(
    "algorithm", doc="an AlgorithmPreset (trivium.algorithm.presets)", check=instance_of(AlgorithmPreset)
)
for _preset in _BUILTIN:
    PRESETS.register(_preset.name)(_preset)


def get_preset(name: str) -> AlgorithmPreset:
    """The preset called ``name`` (``algorithm.algorithm_type``): registered, or ``module:PRESET``."""
    return PRESETS.get(name)
