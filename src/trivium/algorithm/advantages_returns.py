"""Returns-to-go of per-token rewards: REINFORCE++ (no critic), and the machinery GAE shares with it.

REINFORCE++ here and GAE (``advantages_critic``) run a backward recursion over the *valid* tokens of each
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

from dataclasses import dataclass

import torch
from torch import Tensor

from trivium.algorithm.advantages import (
    AdvantageInputs,
    _require,
    _token_stats,
    _valid_seq_index,
    _whiten,
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
    _check_unit("reinforceplusplus", gamma=gamma)
    token_rewards = _require(inputs, "token_rewards", "reinforceplusplus", TOKEN_REWARDS_HINT)
    grid = _SequenceGrid.build(inputs.mask, inputs.seq_index, inputs.rewards.numel(), "reinforceplusplus")
    returns = grid.to_tokens(_discounted_reverse_cumsum(grid.to_grid(token_rewards), gamma))
    mean, std = _token_stats(returns, inputs.mask)
    metrics = {"advantage/return_mean": mean, "advantage/return_std": std}
    return _whiten(returns, inputs.mask), metrics


@dataclass(frozen=True)
class _SequenceGrid:
    """The tokens on ``mask`` regrouped by sequence: token k sits at grid ``[seq[k], rank[k]]``.

    ``rank`` is the token's position among its sequence's valid tokens, which follows from the layout
    rule "the tokens of one sequence are contiguous and in order within its row": in row-major order
    the valid tokens of a sequence form one run, and rank = index in the run.
    """

    mask: Tensor  # [R, L] bool
    seq: Tensor  # [K] sequence of each valid token (row-major order)
    rank: Tensor  # [K] its index among its sequence's valid tokens
    num_seqs: int
    width: int  # max valid tokens of one sequence

    @classmethod
    def build(cls, mask: Tensor, seq_index: Tensor, num_seqs: int, who: str) -> _SequenceGrid:
        seq = _valid_seq_index(mask, seq_index, num_seqs, who)
        k = torch.arange(seq.numel(), device=seq.device)
        first = torch.full((num_seqs,), seq.numel(), dtype=torch.long, device=seq.device)
        first = first.scatter_reduce(0, seq, k, reduce="amin")
        last = torch.full_like(first, -1).scatter_reduce(0, seq, k, reduce="amax")
        counts = torch.bincount(seq, minlength=num_seqs)
        split = (counts > 0) & (last - first + 1 != counts)
        if split.any():
            raise ValueError(
                f"{who}: the action tokens of sequence(s) {split.nonzero().flatten()[:10].tolist()} are "
                f"interleaved with another sequence's; seq_index must keep each sequence contiguous "
                f"within one row (trivium.types.collate does)"
            )
        width = int(counts.max()) if seq.numel() else 0
        return cls(mask, seq, k - first[seq], num_seqs, width)

    def to_grid(self, values: Tensor) -> Tensor:
        """``[R, L]`` -> ``[N, W]``: row i holds sequence i's valid-token values in order, then zeros."""
        grid = torch.zeros(self.num_seqs, self.width, dtype=values.dtype, device=values.device)
        grid[self.seq, self.rank] = values[self.mask]
        return grid

    def to_tokens(self, grid: Tensor) -> Tensor:
        """``[N, W]`` -> ``[R, L]`` (0 off the mask)."""
        out = torch.zeros(self.mask.shape, dtype=grid.dtype, device=grid.device)
        out[self.mask] = grid[self.seq, self.rank]
        return out


def _discounted_reverse_cumsum(x: Tensor, decay: float) -> Tensor:
    """y[:, k] = Σ_{j ≥ k} decay^{j−k} x[:, j] along the last dim of ``x [N, W]``."""
    if decay == 1.0:
        return x.flip(-1).cumsum(-1).flip(-1)
    if decay == 0.0:
        return x.clone()
    out = torch.empty_like(x)
    running = x.new_zeros(x.shape[0])
    for k in range(x.shape[-1] - 1, -1, -1):  # over token positions; every sequence moves together
        running = x[:, k] + decay * running
        out[:, k] = running
    return out


def _check_unit(who: str, **params: float) -> None:
    for name, value in params.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{who} needs 0 <= {name} <= 1 (a discount factor), got {name}={value}")
