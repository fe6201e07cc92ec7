"""Checkpoints: model weights (safetensors via save_pretrained; a LoRA adapter in PEFT format; with several
ranks also torch.distributed.checkpoint shards), tokenizer, optimizer/scheduler/RNG state.

A checkpoint is written into a temporary folder and renamed into place, so a reader never sees a
half-written one; a crash mid-write leaves only a ``.tmp`` folder that the next save removes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from trivium.faults import maybe_die
from trivium.trainer.model_io import MODEL_DIR

STATE_FILE = "trainer_state.pt"
META_FILE = "meta.json"


def save_checkpoint(
    folder: str | Path, trainer, tokenizer, trainer_state: dict[str, Any], meta: dict[str, Any]
) -> Path:
    """Write the checkpoint ``folder``: the trainer's model part (``trainer.save_model``: ``model/``, and
    ``dcp/`` shards with several ranks), the tokenizer next to the model, the trainer state and ``meta``."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    trainer.save_model(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / MODEL_DIR)
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({**trainer_state, "rng": rng}, tmp / STATE_FILE)
    (tmp / META_FILE).write_text(json.dumps({**meta, "saved_at": time.time()}, indent=1))
    maybe_die("checkpoint", int(meta.get("step", -1)))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def prune_checkpoints(root: str | Path, keep: int, prefix: str = "step_") -> None:
    """Delete all but the ``keep`` most recent ``step_N`` folders under ``root``."""
    root = Path(root)
    if not root.exists():
        return
    steps = sorted(
        (
            p
            for p in root.iterdir()
            if p.is_dir() and p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()
        ),
        key=lambda p: int(p.name[len(prefix) :]),
    )
    for old in steps[:-keep] if keep > 0 else steps:
        shutil.rmtree(old)
