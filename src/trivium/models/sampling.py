"""One decoding step: pick the next token of every running row and report its log-prob.

Design decisions:
- The reported log-prob comes from the *unfiltered* temperature-scaled distribution in fp32 (see
  ``protocol.py``); top-k / top-p only restrict which tokens may be drawn. That keeps rollout log-probs equal
  to what the trainer recomputes with one teacher-forced forward pass.
- Filtering order is top-k, then top-p on the renormalised remainder (the transformers and vLLM order).
- The draw uses the caller's ``torch.Generator`` so an engine with a seed is reproducible.
"""

from __future__ import annotations

import torch

from trivium.models.protocol import SamplingParams

__all__ = ["filter_top_k_top_p", "sample_next"]


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens and their log-probs.

    logits: ``[A, V]`` next-token logits of the ``A`` running rows, any float dtype.
    Returns ``tokens [A]`` int64 and ``logprobs [A]`` float32 (temperature 0 reports T = 1 log-probs).
    """
    logits = logits.float()
    temperature = params.temperature if params.temperature > 0 else 1.0
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if params.greedy:
        tokens = logits.argmax(dim=-1)
    else:
        if params.top_k > 0 or params.top_p < 1.0:
            probs = filter_top_k_top_p(logp, params.top_k, params.top_p).softmax(dim=-1)
        else:
            probs = logp.exp()
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


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
