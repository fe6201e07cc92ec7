"""Launching and stopping runs from Studio: ``trivium run`` subprocesses whose runs go under the root.

A launched run is an ordinary ``trivium run -c CONFIG --set checkpoint_root=ROOT`` process in a session of
its own (it outlives Studio); its output goes to ``ROOT/.studio/logs/``. Whether it runs is read from its
``status.json`` (``monitor/status.py``), so runs started from a shell are seen and stopped the same way.
Stopping sends SIGTERM: the run ends after its current step, with a checkpoint, and can be continued.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trivium.monitor.status import read_status
from trivium.studio.files import Guard

__all__ = ["Conflict", "launch", "stop"]


class Conflict(RuntimeError):
    """The request does not fit the run's state (a second launch of a running run, a stop of a finished one)."""


def _run_folder(guard: Guard, config: Path, overrides: list[str]) -> Path:
    """The run folder the config writes to under the root (validating the config, every problem listed)."""
    from trivium.launch.run import run_dir_of
    from trivium.validation.load import load_config

    run_cfg = load_config(config, overrides, given_as="the config to launch")
    return guard.inside(run_dir_of(run_cfg), "runs")


def launch(guard: Guard, config: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Start ``trivium run`` on ``config`` (a file in a config folder); its run id, pid and log file."""
    path = guard.inside(config, "configs")
    if not path.is_file():
        raise FileNotFoundError(f"no config file {config!r} in the config folders")
    overrides = [f"checkpoint_root={guard.root}", "monitor.progress_bar=false", *(overrides or [])]
    folder = _run_folder(guard, path, overrides)
    status = read_status(folder)
    if status is not None and status["state"] == "running":
        raise Conflict(
            f"run {folder.relative_to(guard.root)} is already running (pid {status['pid']}, started from "
            f"{status.get('config')}): stop it first, or launch with another name (--set name=...)"
        )
    logs = guard.root / ".studio" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run_id = str(folder.relative_to(guard.root))
    log_path = logs / f"{run_id.replace(os.sep, '__')}.{int(time.time())}.log"
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path)]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=path.parent, env=env, start_new_session=True
        )
    _CHILDREN[proc.pid] = proc
    return {"id": run_id, "pid": proc.pid, "log": str(log_path.relative_to(guard.root)), "command": cmd}


def stop(guard: Guard, run_id: str) -> dict[str, Any]:
    """SIGTERM to the run's process(es) (each role of a decoupled run); ``Conflict`` when none runs."""
    folder = guard.run_dir(run_id)
    stopped, states = [], []
    for path in sorted(folder.glob("status*.json")):
        parts = path.name.split(".")
        status = read_status(folder, parts[1] if len(parts) == 3 else None) or {}
        states.append(str(status.get("state")))
        if status.get("state") == "running":
            os.kill(int(status["pid"]), signal.SIGTERM)
            stopped.append(int(status["pid"]))
    if not stopped:
        raise Conflict(
            f"run {run_id} is not running ({', '.join(states) or 'no status'}): nothing was stopped"
        )
    _reap()
    return {"id": run_id, "signalled": stopped}


def log_tail(guard: Guard, run_id: str, max_bytes: int = 20000) -> str:
    """The end of the newest Studio log of ``run_id`` (its whole output, launched from Studio), else of the
    log the run writes itself (``run.log`` in its folder, for a run started from the command line); ''
    when there is neither."""
    logs = sorted((guard.root / ".studio" / "logs").glob(f"{run_id.replace(os.sep, '__')}.*.log"))
    if not logs:
        folder = guard.run_dir(run_id)
        logs = sorted(folder.glob("run*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    with logs[-1].open("rb") as f:
        f.seek(max(0, logs[-1].stat().st_size - max_bytes))
        return f.read().decode("utf-8", "replace")


_CHILDREN: dict[int, subprocess.Popen] = {}


def _reap() -> None:
    """Collect launched processes that ended (no zombies while Studio runs)."""
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]
