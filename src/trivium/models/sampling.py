"""One decoding step: pick the next token of every running row and report its log-prob.

Design decisions:
- The reported log-prob comes from the *unfiltered* temperature-scaled distribution in fp32 (see
  ``protocol.py``); top-k / top-p only restrict which tokens may be drawn. That keeps rollout log-probs equal
  to what the trainer recomputes with one teacher-forced forward pass.
- Filtering order is top-k, then top-p on the renormalised remainder (the transformers and vLLM order).
- The draw uses the caller's ``torch.Generator`` so an engine with a seed is reproducible.
- The draw is inverse-CDF sampling in two levels (``draw``), not ``torch.multinomial``: multinomial draws
  an exponential variate for every token of every row, 24 ms for 8 rows and 200 ms for 64 rows at a 152k
  vocabulary on a 2-core CPU (70% of a small model's rollout); summing blocks of ``DRAW_BLOCK`` tokens,
  picking a block and then a token inside it costs one pass over the probabilities (0.7 ms for 64 rows).
  Same distribution; different samples for the same seed than multinomial would give.
"""

from __future__ import annotations

import torch

from trivium.models.protocol import SamplingParams

__all__ = ["draw", "filter_top_k_top_p", "sample_next"]

DRAW_BLOCK = 1024  # tokens per block of the two-level draw
SMALL_VOCAB = 2048  # at or below: torch.multinomial is as fast (measured), and exact by construction


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    never: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens and their log-probs.

    logits: ``[A, V]`` next-token logits of the ``A`` running rows, any float dtype. ``never``: token ids
    that are never drawn (a vision-language model's image placeholder, which stands for image features
    and would make the sequence unreadable); like top-k they restrict the draw, not the reported log-prob.
    Returns ``tokens [A]`` int64 and ``logprobs [A]`` float32 (temperature 0 reports T = 1 log-probs).
    """
    logits = logits.float()
    temperature = params.temperature if params.temperature > 0 else 1.0
    logp = torch.log_softmax(logits / temperature, dim=-1)
    allowed = logp if never is None else logp.index_fill(1, never, float("-inf"))
    if params.greedy:
        tokens = allowed.argmax(dim=-1)
    else:
        if params.top_k > 0 or params.top_p < 1.0:
            probs = filter_top_k_top_p(allowed, params.top_k, params.top_p).softmax(dim=-1)
        else:
            probs = allowed.exp()
        tokens = draw(probs, generator)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs [A, V]`` (non-negative, rows need not sum to 1), drawn with the
    row's probabilities: a uniform variate times the row's mass picks a block of ``DRAW_BLOCK`` tokens by
    the blocks' cumulative mass (float64), then a token by the cumulative mass inside that block. A
    token of probability 0 is never drawn (a row whose rounding lands on one is drawn again with
    multinomial)."""
    rows, vocab = probs.shape
    if vocab <= SMALL_VOCAB:
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    full = vocab // DRAW_BLOCK * DRAW_BLOCK
    mass = probs[:, :full].reshape(rows, -1, DRAW_BLOCK).sum(-1).double()  # float32 inside a block
    if full < vocab:
        mass = torch.cat([mass, probs[:, full:].sum(-1, keepdim=True).double()], dim=1)
    cdf = mass.cumsum(-1)
    u = torch.rand(rows, 1, dtype=torch.float64, generator=generator, device=probs.device) * cdf[:, -1:]
    block = torch.searchsorted(cdf, u, right=True).clamp_(max=mass.size(1) - 1)
    rest = u - (cdf.gather(1, block) - mass.gather(1, block))  # the variate's place inside its block
    index = block * DRAW_BLOCK + torch.arange(DRAW_BLOCK, device=probs.device)
    inner = probs.gather(1, index.clamp(max=vocab - 1)).masked_fill(index >= vocab, 0.0).double()
    pick = torch.searchsorted(inner.cumsum(-1), rest, right=True).clamp_(max=DRAW_BLOCK - 1)
    tokens = (block * DRAW_BLOCK + pick).squeeze(1).clamp_(max=vocab - 1)
    zero = probs.gather(1, tokens[:, None]).squeeze(1) <= 0
    if zero.any():  # rounding at a block's end: astronomically rare, drawn again exactly
        tokens[zero] = torch.multinomial(probs[zero], 1, generator=generator).squeeze(1)
    return tokens


def filter_top_k_top_p(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``scores [A, V]`` (logits or log-probs) with tokens outside top-k, then top-p, set to ``-inf``.

    top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (always at least one).
    """
    if 0 < top_k < scores.size(-1):
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores
