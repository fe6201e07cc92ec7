"""Which row layout a train step collates its experiences into: one row a sample, or the shared prompt.

A GRPO step samples each prompt several times; one row a sample runs the prompt's forward and backward once a
sample. The shared-prompt layout (``types.collate``'s ``shared_rows``) runs it once a row: the prompt, then each
sample's response attending to the prompt and to itself (a boolean mask), the same log-probs and gradient.
It pays where prompts are long against responses: measured (``benchmarks/shared_prompt.py``, the 25M model,
bf16 on CPU) 0.48x the train pass at 896-token prompts and 128-token responses, 4 samples, and 1.18x (slower)
at 32-token prompts with 96-token responses, 8 samples, where the rows barely shrink and the mask costs sdpa
its causal kernel. ``trainer.share_prompts: auto`` takes it for a step when its rows' tokens come to at most
``SHARE_AT`` of one row a sample (0.34 and 0.79 in those two cases); ``true`` always, ``false`` never.

It needs attention that takes an arbitrary boolean mask (sdpa, ``models/attention.py``) in every model that
reads the batch (policy, reference, teacher, the critic's backbone: each takes ``TrainBatch.attention_inputs``),
and is not combined with packed rows or images. DPO lays a pair out so (the prompt once, then the chosen and
the rejected response), by the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trivium.types import Experience, shared_prompt_rows, shared_row_length

__all__ = ["MASKED_ATTENTION", "SHARE_AT", "plan_shared_rows", "shared_row_shape", "why_not_shared"]

SHARE_AT = 0.6  # auto: share when the shared rows hold at most this fraction of one-row-a-sample's tokens
MASKED_ATTENTION = ("sdpa", "trivium")  # attention implementations that take a boolean [R, 1, L, L] mask


def why_not_shared(
    pack_length: int | None, vision: bool, models: Sequence[torch.nn.Module | None]
) -> str | None:
    """Why this trainer cannot train shared-prompt rows (None: it can)."""
    if pack_length is not None:
        return "trainer.pack_length packs the rows (a layout of its own)"
    if vision:
        return "the model takes images (a row's M-RoPE positions come from its own mask)"
    for model in models:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if model is not None and impl not in MASKED_ATTENTION:
            return f"the model's attention {impl!r} takes no boolean mask (one of {MASKED_ATTENTION} does)"
    return None


def plan_shared_rows(
    experiences: Sequence[Experience],
    setting: bool | str,
    max_row_tokens: int,
    rows: Sequence[Sequence[int]] | None = None,
) -> tuple[list[list[int]] | None, dict[str, float]]:
    """The shared rows of this step's experiences (``types.shared_prompt_rows``, or ``rows`` where the caller
    has them: DPO's, a pair a row), or None for one row a sample; with ``train/shared_prompt`` (1 when shared)
    and ``train/shared_row_tokens`` (the shared rows' tokens over one-row-a-sample's: the fraction of the
    tokens it would run) for the step's metrics. ``setting``: ``trainer.share_prompts`` (true, false,
    "auto"), for a trainer that can (``why_not_shared``)."""
    if setting is False:
        return None, {}
    rows = shared_prompt_rows(experiences, max_row_tokens) if rows is None else [list(r) for r in rows]
    separate = sum(int(e.tokens.numel()) for e in experiences)
    ratio = sum(shared_row_length(experiences, row) for row in rows) / max(1, separate)
    share = len(rows) < len(experiences) and (setting is True or ratio <= SHARE_AT)
    return (rows if share else None), {"train/shared_prompt": float(share), "train/shared_row_tokens": ratio}


def shared_row_shape(prompt: int, response: int, samples: int, max_row_tokens: int) -> tuple[int, int]:
    """(samples a row, tokens a row) of ``samples`` sequences of ``prompt`` + ``response`` tokens laid out as
    ``types.shared_prompt_rows`` does: as many as fit in ``max_row_tokens`` (0: no limit), two at least."""
    fit = samples if not max_row_tokens else (max_row_tokens - prompt + 1) // (response + 1)
    members = max(1, min(samples, max(2, fit)))
    return members, prompt - 1 + members * (response + 1)
