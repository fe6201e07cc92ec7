"""The algorithm seams: one ``Registry`` (``trivium.registry``) per part, one signature per registry.

A part is registered by name where it is defined (``@POLICY_LOSS_FNS.register("ppo_clip")``), or named in
a config as ``"my_pkg.my_module:my_fn"`` without registering anything.
"""

from __future__ import annotations

from trivium.registry import Registry, UnknownPartError, callable_part

__all__ = [
    "ADVANTAGE_FNS",
    "AGGREGATIONS",
    "KL_FNS",
    "POLICY_LOSS_FNS",
    "Registry",
    "UnknownPartError",
]

_HERE = "trivium.algorithm."
ADVANTAGE_FNS = Registry(
    "advantage fn",
    doc="fn(AdvantageInputs, **args) -> (advantages [R, L], metrics)",
    check=callable_part,
    builtins=[_HERE + m for m in ("advantages", "advantages_group", "advantages_returns")]
    + [_HERE + m for m in ("advantages_critic", "advantages_distill")],
)
POLICY_LOSS_FNS = Registry(
    "policy loss",
    doc="fn(PolicyLossInputs, **args) -> (per-token loss [R, L], metrics)",
    check=callable_part,
    builtins=[_HERE + m for m in ("policy_losses", "losses_mix", "losses_rec", "losses_sequence")],
)
KL_FNS = Registry(
    "KL estimator",
    doc="fn(logprobs [R, L], ref_logprobs [R, L]) -> per-token KL [R, L]",
    check=callable_part,
    builtins=[_HERE + "kl"],
)
AGGREGATIONS = Registry(
    "aggregation",
    doc="fn(mask [R, L], seq_index [R, L], LossScale, *, is_expert) -> weights [R, L]",
    check=callable_part,
    builtins=[_HERE + "aggregation"],
)
