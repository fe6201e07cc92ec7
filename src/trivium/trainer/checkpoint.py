"""Checkpoints: model weights (safetensors via save_pretrained; a LoRA adapter in PEFT format; with several
ranks also torch.distributed.checkpoint shards), tokenizer, optimizer/scheduler/RNG state.

A checkpoint is written into a temporary folder and renamed into place, so a reader never sees a
half-written one; a crash mid-write leaves only a ``.tmp`` folder that the next save removes (and that
resume ignores). A write that fails (disk full, quota, file size limit) removes its ``.tmp`` folder at once,
so that the space it took is free again, and raises ``CheckpointWriteError`` naming the checkpoint, the
error and the newest complete checkpoint a rerun continues from.
"""

from __future__ import annotations

import errno
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
_NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "a file would exceed the file size limit (ulimit -f)",
}


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the run folder holds only complete checkpoints."""


def save_checkpoint(
    folder: str | Path, trainer, tokenizer, trainer_state: dict[str, Any], meta: dict[str, Any]
) -> Path:
    """Write the checkpoint ``folder``: the trainer's model part (``trainer.save_model``: ``model/``, and
    ``dcp/`` shards with several ranks), the tokenizer next to the model, the trainer state and ``meta``."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        trainer.save_model(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / MODEL_DIR)
            copy_processor_files(getattr(tokenizer, "name_or_path", ""), tmp / MODEL_DIR)
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save({**trainer_state, "rng": rng}, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps({**meta, "saved_at": time.time()}, indent=1))
    except (
        Exception
    ) as error:  # OSError, or a library's own (torch: RuntimeError; safetensors: SafetensorError)
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(folder, error) from error
    maybe_die("checkpoint", int(meta.get("step", -1)))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


PROCESSOR_FILES = ("preprocessor_config.json",)  # a vision-language model's image processor


def copy_processor_files(source: str | Path, folder: Path) -> None:
    """The image processor's files of the model folder ``source`` (where the tokenizer came from) into the
    checkpoint's model folder, so that it loads as a whole vision-language model like the original."""
    for name in PROCESSOR_FILES:
        path = Path(source) / name if source else None
        if path is not None and path.is_file() and folder.is_dir():
            shutil.copyfile(path, folder / name)


def _write_error(folder: Path, error: BaseException) -> CheckpointWriteError:
    """What failed, why in words (disk full, ...) and where a rerun continues from."""
    code = _errno_of(error)
    newest = _newest_complete(folder.parent)
    why = _NO_ROOM.get(code, "the write failed") if code is not None else "the write failed"
    if code is None and newest is not None:  # a library that does not say why (torch.save): measure
        need, free = _size(newest), shutil.disk_usage(folder.parent).free
        biggest = max((p.stat().st_size for p in newest.rglob("*") if p.is_file()), default=0)
        limit = _file_size_limit()
        if free < need:
            code, why = errno.ENOSPC, f"the disk is full ({free} bytes free there; a checkpoint takes {need})"
        elif limit is not None and limit < biggest:
            code, why = (
                errno.EFBIG,
                f"{_NO_ROOM[errno.EFBIG]} ({limit} bytes; a checkpoint file takes {biggest})",
            )
    then = (
        f"a rerun of the same command continues from {newest}, the newest complete checkpoint"
        if newest is not None
        else "this stage has no complete checkpoint yet: a rerun starts the stage again"
    )
    if code == errno.EFBIG:
        fix = "Raise the file size limit (ulimit -f)"
    elif code in _NO_ROOM:
        fix = "Free space there (or lower trainer.keep_checkpoints, or move checkpoint_root to a larger disk)"
    else:
        fix = "Check that the folder is writable and has room"
    message = (
        f"could not write checkpoint {folder}: {why} ({type(error).__name__}: {str(error)[:300]}). The "
        f"half-written {folder.name}.tmp was removed. {fix}; {then}"
    )
    return CheckpointWriteError(code or errno.EIO, message)


def _errno_of(error: BaseException | None) -> int | None:
    """The errno of ``error`` or of an OSError it was raised from (torch wraps them in RuntimeError)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, OSError) and error.errno is not None:
            return error.errno
        text = str(error)
        for code, strerror in ((c, os.strerror(c)) for c in _NO_ROOM):
            if strerror in text:
                return code
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _file_size_limit() -> int | None:
    """This process's RLIMIT_FSIZE in bytes (None: unlimited, or not a POSIX system)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _newest_complete(root: Path) -> Path | None:
    steps = [p for p in root.glob("step_*") if (p / META_FILE).is_file() and p.name[5:].isdigit()]
    return max(steps, key=lambda p: int(p.name[5:]), default=None)


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
