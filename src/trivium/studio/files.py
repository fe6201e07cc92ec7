"""What Studio may read and write: run folders under ``--root``, config files in the ``--configs`` folders.

Every path that comes from a request goes through ``Guard.inside``: resolved (symlinks followed, ``..``
collapsed) and refused unless it lies in an allowed folder, so a request cannot reach any other file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trivium.monitor.metrics import METRICS_FILE
from trivium.monitor.status import read_status

__all__ = ["Guard", "OutsideError", "list_runs", "run_summary"]


class OutsideError(PermissionError):
    """A request named a path outside the folders Studio was given."""


@dataclass(frozen=True)
class Guard:
    root: Path  # run folders (and Studio's own state in root/.studio)
    config_dirs: tuple[Path, ...]

    @classmethod
    def of(cls, root: str | Path, config_dirs: list[str | Path]) -> Guard:
        root = Path(root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return cls(root, tuple(Path(d).resolve() for d in config_dirs))

    def inside(self, path: str | Path, where: str = "any") -> Path:
        """``path`` resolved, if it lies under the root (``where`` 'runs'), a config folder ('configs') or
        either ('any'); relative paths are taken from the root (runs) or the first config folder."""
        text = str(path)
        if "\x00" in text or len(text) > 4096:
            raise OutsideError("the path has a NUL byte or is longer than 4096 characters")
        allowed = {"runs": (self.root,), "configs": self.config_dirs, "any": (self.root, *self.config_dirs)}[
            where
        ]
        base = self.root if where == "runs" or not self.config_dirs else self.config_dirs[0]
        p = Path(text)
        resolved = (p if p.is_absolute() else base / p).resolve()
        if not any(resolved == d or d in resolved.parents for d in allowed):
            names = ", ".join(str(d) for d in allowed) or "(no config folder was given: --configs)"
            raise OutsideError(f"{text!r} is outside the folders Studio may use ({names})")
        return resolved

    def run_dir(self, run_id: str) -> Path:
        """The run folder ``run_id`` (its path relative to the root), which must hold a run."""
        folder = self.inside(run_id, "runs")
        if not _is_run(folder):
            raise FileNotFoundError(
                f"no run folder {run_id!r} under {self.root} (no {METRICS_FILE} or status)"
            )
        return folder


def _is_run(folder: Path) -> bool:
    return folder.is_dir() and (
        (folder / METRICS_FILE).exists()
        or any(folder.glob("metrics.*.jsonl"))
        or any(folder.glob("status*.json"))
    )


def list_runs(guard: Guard, max_depth: int = 4) -> list[dict[str, Any]]:
    """Every run folder under the root (at most ``max_depth`` levels down), newest first."""
    runs = []
    for dirpath, dirnames, _ in os.walk(guard.root):
        here = Path(dirpath)
        depth = len(here.relative_to(guard.root).parts)
        dirnames[:] = [
            d for d in dirnames if not d.startswith(".") and d not in ("checkpoints", "base_model")
        ]
        if depth >= max_depth:
            dirnames[:] = []
        if here != guard.root and _is_run(here):
            runs.append(run_summary(guard, here))
            dirnames[:] = []  # a run folder's subfolders are its own (checkpoints, buffers)
    return sorted(runs, key=lambda r: r["updated"], reverse=True)


def run_summary(guard: Guard, folder: Path) -> dict[str, Any]:
    """Id, state (running, finished, stopped, failed, killed, or unknown), stages, last record, checkpoints."""
    statuses = {p.name: read_status(folder, _role(p)) for p in folder.glob("status*.json")}
    statuses = {k: v for k, v in statuses.items() if v}
    states = sorted({s["state"] for s in statuses.values()})
    state = (
        states[0]
        if len(states) == 1
        else ("running" if "running" in states else ",".join(states) or "unknown")
    )
    checkpoints = sorted(str(p.relative_to(folder)) for p in folder.glob("checkpoints/*/step_*"))
    last = _last_record(folder)
    resumable = state in ("stopped", "failed", "killed", "unknown") and bool(checkpoints)
    error = next((s.get("error") for s in statuses.values() if s.get("error")), None)
    stamp = max([p.stat().st_mtime for p in folder.glob("metrics*.jsonl")] + [0.0])
    return {
        "id": str(folder.relative_to(guard.root)),
        "state": state,
        "resumable": resumable,
        "error": error,
        "stages": next((s.get("stages") for s in statuses.values() if s.get("stages")), None),
        "config": next((s.get("config") for s in statuses.values() if s.get("config")), None),
        "last": last,
        "checkpoints": checkpoints[-5:],
        "updated": max([stamp] + [s.get("updated", 0.0) for s in statuses.values()]),
    }


def _role(path: Path) -> str | None:
    parts = path.name.split(".")
    return parts[1] if len(parts) == 3 else None


def _last_record(folder: Path) -> dict[str, Any] | None:
    """The newest step record (stage, step, global step and a few headline numbers)."""
    newest = None
    for path in [folder / METRICS_FILE, *sorted(folder.glob("metrics.*.jsonl"))]:
        if not path.exists():
            continue
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "step" in record:
                if newest is None or record.get("global_step", 0) > newest.get("global_step", 0):
                    newest = record
                break
    if newest is None:
        return None
    keep = ("stage", "step", "global_step", "train/loss", "rollout/reward_mean")
    out = {k: newest[k] for k in keep if k in newest}
    out.update({k: v for k, v in newest.items() if k.startswith("eval/") and k.endswith("/accuracy")})
    return out
