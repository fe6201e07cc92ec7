"""``status.json`` in a run folder: whether the run is running, finished, stopped or failed, and why.

Written by ``trivium run`` when it starts and when it ends (atomically: a reader never sees half a file),
read by ``trivium studio`` and by anyone's scripts. A status that says ``running`` but whose process is gone
was killed (SIGKILL, out of memory, the machine went down): ``read_status`` reports it as ``killed``; the run
continues from its newest checkpoint with the same command. The processes of a decoupled run each write
their own file (``status.explore.json``, ``status.train.json``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from trivium.files import write_atomically

__all__ = ["read_status", "recorded", "status_path", "write_status"]

STATES = ("running", "finished", "stopped", "failed")


def status_path(run_dir: Path, role: str | None = None) -> Path:
    return Path(run_dir) / (f"status.{role}.json" if role else "status.json")


def write_status(run_dir: Path, state: str, role: str | None = None, **fields: Any) -> None:
    """Record ``state`` (one of ``STATES``) with this process's pid and host, the time and ``fields``."""
    if state not in STATES:
        raise ValueError(f"run status {state!r} is not one of {STATES}")
    path = status_path(run_dir, role)
    old = _load(path) if state != "running" else {}
    record = {
        **old,
        "state": state,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "updated": time.time(),
        **fields,
    }
    if state == "running":
        record["started"] = record["updated"]
    write_atomically(path, json.dumps(record, default=str))


def read_status(run_dir: Path, role: str | None = None) -> dict[str, Any] | None:
    """The recorded status; ``running`` becomes ``killed`` when its process (on this host) is gone. None when
    the folder has no status file (a run of an older trivium, or not a run)."""
    record = _load(status_path(run_dir, role))
    if not record:
        return None
    here = record.get("host") == socket.gethostname()
    if record.get("state") == "running" and here and not _alive(int(record.get("pid", 0))):
        record = {**record, "state": "killed"}
    return record


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


class recorded:  # a context manager, named for how it reads: `with recorded(...)`
    """``running`` while the block runs; then ``finished``, ``stopped`` (one of ``stops`` was raised) or
    ``failed`` with the error's first line."""

    def __init__(
        self, run_dir: Path, role: str | None, stops: tuple[type[BaseException], ...], **fields: Any
    ):
        self.run_dir, self.role, self.stops, self.fields = run_dir, role, stops, fields

    def __enter__(self) -> recorded:
        write_status(self.run_dir, "running", self.role, **self.fields)
        return self

    def __exit__(self, kind, error, tb) -> None:
        if error is None:
            write_status(self.run_dir, "finished", self.role)
            return
        message = (str(error).strip().splitlines() or [""])[0][:500]
        state = "stopped" if isinstance(error, self.stops) else "failed"
        write_status(self.run_dir, state, self.role, error=f"{type(error).__name__}: {message}")
