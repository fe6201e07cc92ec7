"""Files written whole or not at all, and JSONL files cut back to a point (a resumed process writes the
rest again). Every atomic write of the package goes through here.

``write_atomically`` writes into a temporary file beside the target (named for this process and thread, so
two writers never share one) and renames it over the target: a reader sees the old file or the new one,
never a half-written one, and a kill leaves at most a stray ``*.tmp``. ``durable=True`` also syncs the file
and its folder to disk before returning, for what must survive a power loss (the buffer's read position);
without it the file survives a crash of the process, not of the machine (status, metrics, states that a
resumed run rebuilds anyway).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "rewrite_jsonl", "write_atomically"]


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = False) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to (``torch.save(obj, tmp)``); on leaving the block
    it replaces ``path``, and is removed instead when the block raised."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        sync_folder(path.parent)


def write_atomically(path: str | Path, data: str | bytes, *, durable: bool = False) -> None:
    """``path`` holds ``data`` (text as UTF-8), whole, after this returns (see the module docstring)."""
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def sync_folder(folder: str | Path) -> None:
    """Sync a folder's entries to disk (a rename in it is durable after this)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rewrite_jsonl(path: str | Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Keep the records of JSONL file ``path`` for which ``keep(record)`` holds, in order; a line cut short
    by a kill is dropped too. The file is rewritten atomically, and only when something is dropped. Returns
    how many lines were dropped (0 when there is no file)."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and keep(record):
            kept.append(line)
    if len(kept) < len(lines):
        write_atomically(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)
