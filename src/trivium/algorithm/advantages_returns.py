"""Returns-to-go of per-token rewards: REINFORCE++ (no critic); GAE runs on the same grid.

REINFORCE++ here and GAE (``advantages_critic``) run a backward recursion (on ``advantage_parts.SequenceGrid``) over the *valid* tokens of each
response: masked tokens inside a response (tool or environment output) are skipped, the running return
passes over them unchanged, and discounting counts valid tokens only (γ^{s−t} with s − t the number of
action tokens between them).

Design decisions:
- Vectorised over sequences. The valid tokens of each sequence are gathered, in order, into the rows of a
  dense grid ``[N, W]`` (W = the longest response in action tokens) right-padded with zeros. On that grid
  "the next valid token" is simply the next column, and zero padding is exactly the "value and advantage
  after the last token are 0" of the recursion, so one reverse loop over the W columns serves every
  sequence at once, whether rows were padded or packed. γ = 1 (the LLM default) needs no loop at all.
- Whitening uses only tokens on the mask (docs/algorithms.md §22.4).

Left out: REINFORCE++'s k2 per-token penalty variant (pick estimator="k2" when building the token rewards).
"""

from __future__ import annotations

from torch import Tensor

from trivium.algorithm.advantage_parts import (
    AdvantageInputs,
    SequenceGrid,
    check_unit,
    discounted_reverse_cumsum,
    require_input,
    token_stats,
    whiten_on_mask,
)
from trivium.algorithm.registry import ADVANTAGE_FNS

__all__ = ["reinforceplusplus"]

TOKEN_REWARDS_HINT = (
    "build them with trivium.algorithm.rewards_shaping.kl_penalty_token_rewards (KL penalty on, "
    "algorithm.kl_penalty.coef > 0) or outcome_token_rewards (no penalty)"
)


@ADVANTAGE_FNS.register("reinforceplusplus")
def reinforceplusplus(inputs: AdvantageInputs, *, gamma: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++ (docs/algorithms.md §8): returns-to-go of the token rewards, whitened over the batch.

    Ret_{i,t} = Σ_{s ≥ t, valid} γ^{s−t} rw_{i,s} (γ = 1: R_i − β Σ_{s≥t} k_s), then
    A = (Ret − mean_B) / sqrt(var_B + 1e-8) over all valid tokens of the batch (unbiased var). Works with
    one response per prompt: the global statistics replace a group baseline. Needs
    ``inputs.token_rewards`` ``[R, L]`` (entries off the mask are ignored). Returns ``[R, L]``.
    """
    check_unit("reinforceplusplus", gamma=gamma)
    token_rewards = require_input(inputs, "token_rewards", "reinforceplusplus", TOKEN_REWARDS_HINT)
    grid = SequenceGrid.build(inputs.mask, inputs.seq_index, inputs.rewards.numel(), "reinforceplusplus")
    returns = grid.to_tokens(discounted_reverse_cumsum(grid.to_grid(token_rewards), gamma))
    mean, std = token_stats(returns, inputs.mask)
    metrics = {"advantage/return_mean": mean, "advantage/return_std": std}
    return whiten_on_mask(returns, inputs.mask), metrics
