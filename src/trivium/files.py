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

__all__ = ["NETWORK_FILE_SYSTEMS", "atomic_path", "mount_of", "rewrite_jsonl", "write_atomically"]


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


# file system types whose files live on another machine (SQLite's write-ahead log cannot work there)
NETWORK_FILE_SYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs", "lustre", "gpfs"}
    | {"beegfs", "ocfs2", "gfs2", "davfs"}
    | {f"fuse.{name}" for name in ("sshfs", "s3fs", "gcsfuse", "juicefs", "glusterfs", "ceph", "rclone")}
    | {"fuse.goofys", "fuse.mountpoint-s3", "fuse.blobfuse", "fuse.blobfuse2"}
)
MOUNTS = Path("/proc/self/mounts")  # Linux; elsewhere mount_of knows nothing


def mount_of(path: str | Path) -> tuple[str, str] | None:
    """(file system type, mount point) of the mount that holds ``path`` (resolved), from ``MOUNTS``; None
    where that table cannot be read (not Linux)."""
    try:
        table = MOUNTS.read_text()
    except OSError:
        return None
    target = Path(path).resolve()
    found: tuple[str, str] | None = None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(_unescape(fields[1]))
        holds = target == point or point in target.parents
        # the deepest mount point wins; of two at one point, the later (mounted over the first)
        if holds and (found is None or len(str(point)) >= len(found[1])):
            found = (fields[2], str(point))
    return found


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash in paths as octal escapes (\\040)."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
