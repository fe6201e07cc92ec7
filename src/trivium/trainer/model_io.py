"""The trainer's model going out: weights for rollout engines, and the model part of checkpoints.

``export_weights`` is the one way weights leave a trainer (weight sync, evaluation engines, the next
stage): the gather of sharded weights (FSDP2), the merge of LoRA adapters and the cast to the receiving
engine's dtype happen here, in that order, and the result always has the plain model's names.

A checkpoint's model part (``save_model``): ``model/`` is a Hugging Face folder written by rank 0 (the
full weights, or the LoRA adapter in PEFT format); with a multi-rank strategy ``dcp/`` also holds the
model and optimizer state as torch.distributed.checkpoint shards, one file per rank (``Parallel``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from trivium.models import lora
from trivium.models.weights import cast_floating
from trivium.trainer.parallel import Parallel

__all__ = ["MODEL_DIR", "SHARDS_DIR", "export_weights", "save_model"]

MODEL_DIR = "model"
SHARDS_DIR = "dcp"


def export_weights(
    model: torch.nn.Module, parallel: Parallel, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The full, merged weights under the plain model's names on rank 0 (collective when sharded: every
    rank calls it; ranks > 0 of FSDP2 get an empty dict)."""
    state = parallel.full_state_dict(model)
    module = parallel.unwrap(model)
    if lora.is_peft(module) and state:
        state = lora.merged_state_dict(state, lora.lora_layers(module))
    return cast_floating(state, dtype)


def save_model(model: torch.nn.Module, parallel: Parallel, optimizer, folder: Path) -> None:
    """Write ``folder/model`` (rank 0) and, for multi-rank strategies, ``folder/dcp`` (every rank)."""
    state = parallel.full_state_dict(model)
    if parallel.is_leader:
        parallel.unwrap(model).save_pretrained(folder / MODEL_DIR, state_dict=state, safe_serialization=True)
    if parallel.sharded:
        parallel.save_sharded(model, optimizer, folder / SHARDS_DIR)
