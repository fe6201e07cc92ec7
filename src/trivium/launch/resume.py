"""Exact resume: find the newest complete checkpoint of a run folder and continue from it.

A checkpoint folder ``checkpoints/{stage}/step_N`` is complete once it exists (it is renamed into place
only after everything is written). It holds the model, the trainer state (optimizer, schedule, RNG,
critic, KL controller) and under ``resume`` what the loops need: the explorer's task position, group-id
counter and sampling RNG, the dataset position, and the storage claims trained into it. Metrics records
written after that checkpoint are dropped from the process's metrics file (``MetricsWriter.drop_after``,
the one mechanism of every mode): the resumed run writes them again, so every step has exactly one record.

The resume tests crash real runs at named points with ``trivium.faults`` (``TRIVIUM_KILL_AT``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class ResumePoint:
    stage_index: int
    stage: str
    step: int  # the last completed step of that stage
    global_step: int
    version: int
    path: Path  # the checkpoint folder
    strategy: str = "single"  # trainer.strategy and world_size that wrote it
    world_size: int = 1

    def trainer_state(self) -> dict[str, Any]:
        """The trainer state saved with the checkpoint, loaded without running code: only tensors and plain
        Python values (a checkpoint from elsewhere cannot execute anything through pickle)."""
        return load_state_file(self.path / "trainer_state.pt")


class ResumeRefused(RuntimeError):
    """A checkpoint that this run, as configured, cannot continue from; the message says how to."""


def check_strategy(point: ResumePoint, strategy: str, world_size: int) -> None:
    """Refuse, before anything loads, a resume across one process and several ranks: the optimizer state of a
    ``single`` checkpoint is one file, that of ``ddp``/``fsdp2`` torch.distributed.checkpoint shards, and only
    the latter reshard to another world size."""
    if (point.strategy == "single") == (strategy == "single"):
        return
    raise ResumeRefused(
        f"{point.path} was written by trainer.strategy {point.strategy} on {point.world_size} rank(s), and this "
        f"run trains stage {point.stage} with {strategy} on {world_size}: a checkpoint's optimizer state moves "
        "between world sizes of ddp and fsdp2 (torch.distributed.checkpoint reshards it), not between one "
        f"process and several ranks. Continue with trainer.strategy {point.strategy} and trainer.world_size "
        f"{point.world_size}, or start a new run (--set name=...) from its weights: model.path="
        f"{point.path / 'model'}"
    )


def load_state_file(path: Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``, with an error that names the file when it holds more."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # pickle refusing an object type, or a damaged file
        raise RuntimeError(
            f"{path} cannot be loaded as plain tensors and values ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}). Trivium loads state files with weights_only=True, so a file "
            "that needs code to load is refused; was it written by this version of trivium?"
        ) from error


def find_resume_point(run_dir: Path, stage_names: list[str]) -> ResumePoint | None:
    best = None
    for meta_file in (run_dir / "checkpoints").glob("*/step_*/meta.json"):
        if meta_file.parent.name.endswith(".tmp"):
            continue
        meta = json.loads(meta_file.read_text())
        if meta.get("stage") not in stage_names:
            continue
        point = ResumePoint(
            stage_index=stage_names.index(meta["stage"]),
            stage=meta["stage"],
            step=meta["step"],
            global_step=meta["global_step"],
            version=meta["version"],
            path=meta_file.parent,
            strategy=meta.get("strategy", "single"),
            world_size=meta.get("world_size", 1),
        )
        if best is None or (point.global_step, point.stage_index) > (best.global_step, best.stage_index):
            best = point
    return best
