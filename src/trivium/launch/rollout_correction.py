"""``algorithm.rollout_is_cap`` as a run uses it: set, or decided from the rollout engine's numerics.

Left unset (None), truncated importance sampling against the sampler is on (cap 2) exactly where the
rollout engine samples with other numerics than the trainer's weights: weights in another dtype
(``explorer.rollout.dtype``, ``auto`` included) or a forward under autocast. The trainer applies it in the
training forward itself when a batch makes one update (trainer/trainer.py), so it costs no extra pass.
"""

from __future__ import annotations

import logging

import torch

from trivium.config.schema import TriviumConfig

log = logging.getLogger(__name__)

AUTO_ROLLOUT_IS_CAP = 2.0


def rollout_is_cap(
    cfg: TriviumConfig, policy: torch.nn.Module | None = None, *, quiet: bool = False
) -> float:
    """``algorithm.rollout_is_cap`` as a run uses it: the value set, or for None (the default) truncated
    importance sampling with cap 2 where the rollout engine samples with weights in another dtype than the
    trainer's (``policy``'s; None: model.dtype on model.device, as the doctor reads it) or under autocast
    (the same decision as ``build_rollout_model``'s, on this process's hardware), off (0) otherwise. Logged
    unless ``quiet``."""
    from trivium.models.bf16 import rollout_dtype
    from trivium.models.loading import resolve_device, resolve_dtype

    if cfg.algorithm.rollout_is_cap is not None:
        return cfg.algorithm.rollout_is_cap
    r, param = cfg.explorer.rollout, None if policy is None else next(policy.parameters())
    device = resolve_device(cfg.model.device) if param is None else param.device
    weights = resolve_dtype(cfg.model.dtype, device) if param is None else param.dtype
    dtype, why = rollout_dtype(
        r.dtype, weights, device, r.engine_type, cfg.trainer.precision, r.autocast_dtype
    )
    if dtype == weights and r.autocast_dtype is None:
        return 0.0
    sampler = (
        f"{str(dtype).removeprefix('torch.')} weights (explorer.rollout.dtype {r.dtype}: {why})"
        if dtype != weights
        else f"{r.autocast_dtype} autocast (explorer.rollout.autocast_dtype)"
    )
    if not quiet:
        log.info(
            "algorithm.rollout_is_cap None -> %g: the rollout engine samples with %s, the trainer's weights are "
            "%s; each token's advantage is weighed by min(pi_trainer / pi_rollout, %g) (rollout_is/*)",
            AUTO_ROLLOUT_IS_CAP, sampler, str(weights).removeprefix("torch."), AUTO_ROLLOUT_IS_CAP,
        )  # fmt: skip
    return AUTO_ROLLOUT_IS_CAP
