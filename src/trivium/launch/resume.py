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

import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


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
    previous: Path | None = None  # the newest intact checkpoint before this one (where a damaged one sends)

    def trainer_state(self) -> dict[str, Any]:
        """The trainer state saved with the checkpoint, loaded without running code: only tensors and plain
        Python values (a checkpoint from elsewhere cannot execute anything through pickle)."""
        with damage_named(self.path, self.previous):
            saved = load_state_file(self.path / "trainer_state.pt")
            if not isinstance(saved, dict) or not isinstance(saved.get("resume", {}), dict):
                raise ValueError(f"trainer_state.pt holds a {type(saved).__name__}, not the trainer's state")
            return saved


class ResumeRefused(RuntimeError):
    """A checkpoint that this run, as configured, cannot continue from; the message says how to."""


class CheckpointDamaged(ResumeRefused):
    """The checkpoint a run would resume from cannot be read; the message names the file and the way back
    to the checkpoint before it."""

    def __init__(self, folder: Path, why: str, previous: Path | None):
        aside = f"mv {folder} {folder}.damaged"
        back = (
            f"The newest checkpoint before it is {previous}: move the damaged one aside (`{aside}`) and run the "
            f"same command again to continue from {previous.parent.name}/{previous.name}"
            if previous is not None
            else "There is no intact checkpoint before it: move it aside and run again to start over"
        )
        super().__init__(
            f"checkpoint {folder} is damaged: {why}. {back}; or start the run over with --overwrite"
        )


@contextlib.contextmanager
def damage_named(folder: Path, previous: Path | None) -> Iterator[None]:
    """Reading a checkpoint's files: whatever they raise (a truncated file, garbage, values of the wrong
    type) becomes ``CheckpointDamaged`` naming the folder and the checkpoint before it."""
    try:
        yield
    except ResumeRefused:
        raise
    except Exception as error:
        text = str(error).splitlines()[0][:300] if str(error) else ""
        raise CheckpointDamaged(folder, f"{type(error).__name__}: {text}", previous) from error


def check_strategy(point: ResumePoint, strategy: str, world_size: int) -> None:
    """Refuse, before anything loads, a resume across one process and several ranks: the optimizer state of a
    ``single`` checkpoint is one file, that of ``ddp``/``fsdp2`` torch.distributed.checkpoint shards, and only
    the latter reshard to another world size."""
    from trivium.trainer.parallel import STRATEGIES

    if STRATEGIES.get(point.strategy).sharded == STRATEGIES.get(strategy).sharded:
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
    if path.exists() and path.stat().st_size == 0:
        raise RuntimeError(f"{path} is empty (0 bytes): it was cut off while being written or copied")
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # pickle refusing an object type, or a damaged file
        text = str(error).strip().splitlines()[0][:300] if str(error).strip() else "no message"
        raise RuntimeError(
            f"{path} cannot be loaded as plain tensors and values ({type(error).__name__}: {text}). Trivium "
            "loads state files with weights_only=True, so a file that needs code to load is refused, and a "
            "damaged one cannot be read; was it written, whole, by this version of trivium?"
        ) from error


_STEP_FOLDER = re.compile(r"step_(\d+)")


def find_resume_point(run_dir: Path, stage_names: list[str]) -> ResumePoint | None:
    """The newest complete checkpoint of ``stage_names`` under ``run_dir`` (None: there is none). A
    damaged one (its ``meta.json`` missing, not JSON, or of the wrong shape) newer than it is refused with
    ``CheckpointDamaged``; one older than it is only logged."""
    intact: list[ResumePoint] = []
    damaged: list[tuple[tuple[int, int], Path, str]] = []
    for folder in (run_dir / "checkpoints").glob("*/step_*"):
        found = _STEP_FOLDER.fullmatch(folder.name)  # not step_N.tmp (half written) nor step_N.damaged
        if found is None or not folder.is_dir() or folder.parent.name not in stage_names:
            continue
        stage_index = stage_names.index(folder.parent.name)
        try:
            intact.append(_read_point(folder, stage_index))
        except (OSError, ValueError) as error:
            damaged.append(((stage_index, int(found.group(1))), folder, str(error)))
    intact.sort(key=lambda p: (p.global_step, p.stage_index))
    best = intact[-1] if intact else None
    for order, folder, why in sorted(damaged, reverse=True):
        if best is None or order > (best.stage_index, best.step):
            raise CheckpointDamaged(folder, why, None if best is None else best.path)
        log.warning("checkpoint %s is damaged (%s); a newer one is intact and resumed from", folder, why)
    if best is not None and len(intact) > 1:
        best = dataclasses.replace(best, previous=intact[-2].path)
    return best


def _read_point(folder: Path, stage_index: int) -> ResumePoint:
    """The ``ResumePoint`` of a checkpoint folder from its ``meta.json``; ValueError naming what is wrong."""
    meta_file = folder / "meta.json"
    if not meta_file.exists():
        raise ValueError("it has no meta.json (a checkpoint folder is renamed into place only once complete)")
    try:
        meta = json.loads(meta_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{meta_file.name} is not JSON ({error})") from None
    wanted = {
        "stage": str,
        "step": int,
        "global_step": int,
        "version": int,
        "strategy": str,
        "world_size": int,
    }
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_file.name} holds a {type(meta).__name__}, not an object")
    for key, kind in wanted.items():
        optional = key in ("strategy", "world_size")
        if (key not in meta and not optional) or (
            key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool))
        ):
            raise ValueError(f"{meta_file.name} has {key}={meta.get(key)!r}, not a {kind.__name__}")
    if meta["stage"] != folder.parent.name or meta["step"] != int(folder.name.split("_")[1]):
        raise ValueError(
            f"{meta_file.name} says stage {meta['stage']!r} step {meta['step']}, not its folder's"
        )
    return ResumePoint(
        stage_index=stage_index,
        stage=meta["stage"],
        step=meta["step"],
        global_step=meta["global_step"],
        version=meta["version"],
        path=folder,
        strategy=meta.get("strategy", "single"),
        world_size=meta.get("world_size", 1),
    )
