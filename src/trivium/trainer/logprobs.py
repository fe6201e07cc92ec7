"""Per-token log-probabilities of a TrainBatch under a causal LM, target-aligned with ``input_ids``."""

from __future__ import annotations

import torch

from trivium.trainer.parallel import Parallel
from trivium.types import TrainBatch


def token_logprobs(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0) -> torch.Tensor:
    """``[R, L]`` float32: entry ``[r, t]`` = log p(input_ids[r, t] | input_ids[r, :t]) at ``temperature``.

    Position 0 (and every packed sequence start) has no prediction and is 0; callers mask with
    ``batch.loss_mask``. Log-probs are taken in float32 whatever the model dtype, as
    ``logit[token] - logsumexp(logits)``, which avoids materialising a second [R, L, V] tensor.
    """
    return forward_logprobs(model, batch, temperature)[0]


def forward_logprobs(
    model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` and, when asked, the full-vocabulary entropy ``[R, L]`` at the same positions."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lp = torch.nn.functional.pad(picked - torch.logsumexp(logits, dim=-1), (1, 0), value=0.0)
    if not entropy:
        return lp, None
    from trivium.algorithm.losses_entropy import entropy_from_logits

    return lp, torch.nn.functional.pad(entropy_from_logits(logits, 1.0), (1, 0), value=0.0)


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    micro_batch_size: int,
    temperature: float = 1.0,
    parallel: Parallel | None = None,
) -> torch.Tensor:
    """``token_logprobs`` without gradients, ``micro_batch_size`` rows at a time; with several ranks each
    computes its rows (``Parallel.passes``) and the ranks' parts are summed into the whole ``[R, L]``."""
    parallel = parallel or Parallel(batch.input_ids.device)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for rows, real in parallel.passes(torch.arange(batch.num_rows, device=out.device), micro_batch_size):
        lp = token_logprobs(model, _rows(batch, rows), temperature)
        if real:
            out[rows] = lp
    return parallel.sum_(out)


def _rows(batch: TrainBatch, rows: torch.Tensor) -> TrainBatch:
    """Row slice keeping the input tensors only (seq-level fields are not needed for a forward pass)."""
    import dataclasses

    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids[rows],
        attention_mask=None if batch.attention_mask is None else batch.attention_mask[rows],
        position_ids=batch.position_ids[rows],
    )
