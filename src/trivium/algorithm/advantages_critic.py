"""GAE from a critic's values (PPO): advantages and the critic's value targets (docs/algorithms.md §3).

Design decisions:
- The recursion runs over the *valid* tokens of each response, with the per-sequence grid and reverse
  scan of ``advantages_returns`` (vectorised over sequences; masked tokens inside a response are skipped,
  the running value and advantage pass over them unchanged; packed rows are no special case).
- ``gae_with_returns`` returns the value targets as well, which the critic update needs; the registered
  ``gae`` keeps the registry's one signature and drops them.

Left out: values for tokens off the mask (the critic is trained on action tokens only).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trivium.algorithm import advantage_parts as parts
from trivium.algorithm.advantage_parts import AdvantageInputs
from trivium.algorithm.advantages_returns import TOKEN_REWARDS_HINT
from trivium.algorithm.registry import ADVANTAGE_FNS

__all__ = ["gae", "gae_with_returns"]

VALUES_HINT = (
    "set algorithm_type ppo (or another preset that trains a critic, algorithm.critic); the trainer "
    "passes the critic's values of the sampled tokens"
)


def gae_with_returns(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """GAE advantages and value targets (docs/algorithms.md §3), both ``[R, L]``, detached, 0 off the mask.

    Per response, backward over valid tokens (V and Â after the last valid token are 0):
    δ_t = rw_t + γ V_next(t) − V_t,  Â_t = δ_t + γλ Â_next(t),  Ret_t = Â_t + V_t (before whitening);
    with ``whiten`` A = (Â − mean) / sqrt(var + 1e-8) over the valid tokens of the batch. Defaults
    γ = λ = 1 (LLM practice: one terminal reward, no reason to discount). Needs ``inputs.values``
    (V^old from the critic at sampling time) and ``inputs.token_rewards``.
    E.g. rw = [0, 0, 1], V = [0.5, 0.6, 0.8], γ = λ = 1 ⇒ Â = [0.5, 0.4, 0.2], Ret = [1, 1, 1].
    """
    parts.check_unit("gae", gamma=gamma, lam=lam)
    values = parts.require_input(inputs, "values", "gae", VALUES_HINT)
    token_rewards = parts.require_input(inputs, "token_rewards", "gae", TOKEN_REWARDS_HINT)
    grid = parts.SequenceGrid.build(inputs.mask, inputs.seq_index, inputs.rewards.numel(), "gae")
    v = grid.to_grid(values)
    next_v = torch.nn.functional.pad(v[:, 1:], (0, 1))  # the next valid token's value; 0 after the last
    deltas = grid.to_grid(token_rewards) + gamma * next_v - v
    raw = grid.to_tokens(parts.discounted_reverse_cumsum(deltas, gamma * lam))
    returns = torch.where(inputs.mask, raw + values, 0.0)
    raw_mean, raw_std = parts.token_stats(raw, inputs.mask)
    metrics = {
        "advantage/raw_mean": raw_mean,
        "advantage/raw_std": raw_std,
        "advantage/return_mean": parts.token_stats(returns, inputs.mask)[0],
        "advantage/value_mean": parts.token_stats(values, inputs.mask)[0],
    }
    advantages = parts.whiten_on_mask(raw, inputs.mask) if whiten else raw
    return advantages, returns, metrics


@ADVANTAGE_FNS.register("gae")
def gae(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[Tensor, dict[str, float]]:
    """GAE advantages only (``gae_with_returns`` without the value targets); ``[R, L]``."""
    advantages, _, metrics = gae_with_returns(inputs, gamma=gamma, lam=lam, whiten=whiten)
    return advantages, metrics


gae.requires = frozenset({"values", "token_rewards"})  # read by the trainer, see AlgorithmSpec
