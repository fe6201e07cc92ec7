"""Reward shaping before the advantage: the KL penalty in the rewards and its β, DAPO's length penalty
and DAPO's group filter.

Design decisions:
- Pure functions of tensors, plus two tiny β controllers (dataclasses with ``state_dict`` for checkpoints).
  The trainer decides when to call them; nothing here is registered, because there is one way to do each.
- Token rewards ``rw [R, L]`` live on the loss mask (docs/algorithms.md §2.1a): −β·k on every action token,
  plus R_i on the *last action token* of sequence i, so Σ_t rw_{i,t} = R_i − β Σ_t k_{i,t}. The trainer
  passes that per-sequence sum as ``AdvantageInputs.rewards`` to sequence-level estimators (RLOO) and
  ``rw`` itself as ``token_rewards`` to token-level ones (GAE, REINFORCE++).
- ``kl_penalty_token_rewards`` reports the KL that the adaptive controller needs ("kl_penalty/kl_mean": the
  batch mean of each response's token-mean KL), so one call feeds the next ``update``.
- Inputs are detached on entry: rewards carry no gradient (§0.1).

Left out: per-token rewards from a process reward model (a caller adds them to ``rw``), and the DAPO
"overlong filtering" alternative (it is a mask change, not a reward).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from trivium.algorithm import kl as _kl  # noqa: F401  (registers the estimators in KL_FNS)
from trivium.algorithm.advantage_parts import all_equal_groups, as_float, dense_groups, valid_seq_index
from trivium.algorithm.registry import KL_FNS

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "kl_controller",
    "kl_penalty_token_rewards",
    "outcome_token_rewards",
    "overlong_penalty",
    "zero_variance_groups",
]


def kl_penalty_token_rewards(
    rewards: Tensor,
    mask: Tensor,
    seq_index: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    *,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """Token rewards with the KL penalty folded in (docs/algorithms.md §2.1a).

    rw_{i,t} = −β · k(ℓold_{i,t} − ℓref_{i,t}) on every action token, + R_i on the last action token of
    sequence i. ``rewards [N]``; ``mask``, ``seq_index``, ``old_logprobs``, ``ref_logprobs`` ``[R, L]``;
    ``estimator`` is a ``KL_FNS`` name (k1 by default: unbiased, and its sign does not matter here because
    it is a reward, not a loss). Returns ``rw [R, L]`` (0 off the mask) and metrics: "kl_penalty/kl_mean" is
    KL_obs for ``AdaptiveKLController.update``, "kl_penalty/penalty" the mean of −β Σ_t k per sequence.
    """
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef must be >= 0 (β of the KL penalty; 0 turns it off), got {kl_coef}")
    for name, value in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        if value is None:
            raise ValueError(
                f"kl_penalty_token_rewards needs {name} [R, L] (the behaviour policy's and the reference "
                f"model's log-probs of the sampled tokens); with kl_coef = 0 use outcome_token_rewards"
            )
        if value.shape != mask.shape:
            raise ValueError(
                f"kl_penalty_token_rewards: {name} must have the mask's [R, L] shape {tuple(mask.shape)}, "
                f"got {tuple(value.shape)}"
            )
    kl = torch.where(mask, KL_FNS.get(estimator)(as_float(old_logprobs), as_float(ref_logprobs)), 0.0)
    token_rewards = outcome_token_rewards(rewards, mask, seq_index) - kl_coef * kl
    n = rewards.numel()
    seq = seq_index[mask]
    tokens = torch.zeros(n, dtype=kl.dtype, device=kl.device).index_add_(0, seq, torch.ones_like(kl[mask]))
    seq_kl = torch.zeros(n, dtype=kl.dtype, device=kl.device).index_add_(0, seq, kl[mask])
    has_tokens = tokens > 0
    token_mean_kl = seq_kl[has_tokens] / tokens[has_tokens]
    metrics = {
        "kl_penalty/kl_mean": float(token_mean_kl.mean()) if token_mean_kl.numel() else 0.0,
        "kl_penalty/coef": float(kl_coef),
        "kl_penalty/penalty": float(-kl_coef * seq_kl.mean()) if n else 0.0,
    }
    return token_rewards, metrics


def outcome_token_rewards(rewards: Tensor, mask: Tensor, seq_index: Tensor) -> Tensor:
    """``rw [R, L]``: R_i on the last action token of sequence i, 0 elsewhere (the KL penalty with β = 0).

    A sequence without action tokens has nowhere to put its reward; it trains on nothing anyway.
    """
    n = rewards.numel()
    valid_seq_index(mask, seq_index, n, "outcome_token_rewards")
    positions = torch.arange(mask.numel(), device=mask.device).view(mask.shape)
    last = torch.full((n,), -1, dtype=torch.long, device=mask.device).scatter_reduce(
        0, seq_index.clamp(min=0).flatten(), torch.where(mask, positions, -1).flatten(), reduce="amax"
    )  # flat position of each sequence's last action token: its tokens are in order within one row
    rewards = as_float(rewards)
    out = torch.zeros(mask.numel(), dtype=rewards.dtype, device=rewards.device)
    has_tokens = last >= 0
    out[last[has_tokens]] = rewards[has_tokens]
    return out.view(mask.shape)


class KLController(Protocol):
    """β of the KL penalty across steps; the trainer holds one and checkpoints its ``state_dict``."""

    value: float

    def update(self, observed_kl: float, n_steps: int) -> float: ...

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: Mapping[str, float]) -> None: ...


@dataclass
class FixedKLController:
    """A constant β."""

    value: float

    def __post_init__(self) -> None:
        _check_coef(self.value)

    def update(self, observed_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = float(state["value"])


@dataclass
class AdaptiveKLController:
    """β steered towards a target KL (Ziegler et al., arXiv:1909.08593; docs/algorithms.md §2.1a).

    e = clip(KL_obs / KL_target − 1, −0.2, 0.2);  β ← β · (1 + e · n_steps / horizon).
    The change is proportional and capped at ±20 % per ``horizon`` sequences, so β drifts smoothly; a β of
    0 stays 0. ``horizon`` is counted in sequences (n_steps = the batch size). Only ``value`` is state:
    target and horizon come from the config, so a resumed run may change them.
    """

    value: float
    target: float = 0.1
    horizon: float = 10000

    def __post_init__(self) -> None:
        _check_coef(self.value)
        if not self.target > 0 or not self.horizon > 0:
            raise ValueError(
                f"AdaptiveKLController needs target > 0 and horizon > 0, got target={self.target}, "
                f"horizon={self.horizon} (algorithm.kl_penalty.target_kl and .horizon)"
            )

    def update(self, observed_kl: float, n_steps: int) -> float:
        """Move β after a batch of ``n_steps`` sequences whose KL was ``observed_kl``; returns the new β."""
        if not math.isfinite(observed_kl) or n_steps < 0:
            raise ValueError(
                f"AdaptiveKLController.update needs a finite observed_kl and n_steps >= 0, got "
                f"observed_kl={observed_kl}, n_steps={n_steps}; pass metrics['kl_penalty/kl_mean'] of "
                f"kl_penalty_token_rewards and the number of sequences in the batch"
            )
        error = min(max(observed_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = float(state["value"])


def kl_controller(coef: float, *, adaptive: bool, target: float, horizon: float) -> KLController:
    """The controller that ``algorithm.kl_penalty`` describes (coef, adaptive, target_kl, horizon)."""
    if adaptive:
        return AdaptiveKLController(coef, target=target, horizon=horizon)
    return FixedKLController(coef)


def overlong_penalty(
    response_lengths: Tensor, *, max_length: int, cache_length: int, factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong penalty ``[N]`` (docs/algorithms.md §6), to add to the task rewards.

    0 up to L_max − L_cache tokens, then a linear ramp ((L_max − L_cache) − |y|) / L_cache reaching −1 at
    |y| = L_max, and −1 beyond; times ``factor``. ``response_lengths [N]`` counts action tokens. E.g.
    L_max = 20480, L_cache = 4096: 16384 ⇒ 0, 18432 ⇒ −0.5, 20480 ⇒ −1. A response cut at the generation
    limit thus gets the full −factor: the ramp teaches the policy to stop *before* the limit.
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"overlong_penalty needs 0 < cache_length <= max_length, got cache_length={cache_length}, "
            f"max_length={max_length}: cache_length is the stretch before max_length over which the "
            f"penalty ramps to -factor"
        )
    lengths = as_float(response_lengths)
    soft_limit = max_length - cache_length
    ramp = (soft_limit - lengths) / cache_length
    penalty = torch.where(lengths <= soft_limit, 0.0, torch.where(lengths <= max_length, ramp, -1.0))
    return factor * penalty


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``[N]`` bool: True for every sequence whose group's rewards are all exactly equal.

    DAPO's dynamic sampling (docs/algorithms.md §6) keeps the others: an all-equal group has zero
    group-relative advantage and only dilutes the batch. A group of one is marked too (it has no spread).
    """
    group, counts = dense_groups(group_ids, "zero_variance_groups")
    return all_equal_groups(as_float(rewards), group, counts.numel())[group]


def _check_coef(value: float) -> None:
    if not value >= 0:
        raise ValueError(
            f"the KL penalty coefficient β must be >= 0 (algorithm.kl_penalty.coef), got {value}"
        )
