"""Algorithm parts as pure functions of tensors: advantages, policy losses, KL, aggregation, presets.

Each registry imports the modules of its built-in parts on first use (``Registry(builtins=...)``). This
package imports torch and ``trivium.types`` only.
"""

from trivium.algorithm.advantages import AdvantageInputs, broadcast_to_tokens
from trivium.algorithm.aggregation import LossScale, aggregate, loss_scale, masked_mean, sequence_sums
from trivium.algorithm.kl import k1, k2, k3  # noqa: F401  (registers the KL estimators)
from trivium.algorithm.loss import actor_loss
from trivium.algorithm.policy_losses import PolicyLossInputs
from trivium.algorithm.presets import PRESETS, AlgorithmPreset, get_preset
from trivium.algorithm.registry import (
    ADVANTAGE_FNS,
    AGGREGATIONS,
    KL_FNS,
    POLICY_LOSS_FNS,
    Registry,
    UnknownPartError,
)

__all__ = [
    "ADVANTAGE_FNS",
    "AGGREGATIONS",
    "KL_FNS",
    "POLICY_LOSS_FNS",
    "PRESETS",
    "AdvantageInputs",
    "AlgorithmPreset",
    "LossScale",
    "PolicyLossInputs",
    "Registry",
    "UnknownPartError",
    "actor_loss",
    "aggregate",
    "broadcast_to_tokens",
    "get_preset",
    "loss_scale",
    "masked_mean",
    "sequence_sums",
]
