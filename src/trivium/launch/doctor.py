"""The stall doctor: when no step has finished for ``monitor.stall_timeout_s``, say why, and go on.

A watchdog thread of ``trivium run`` (every mode that steps: both, train, explore, bench; not serve, whose
idle endpoint is no stall). Progress is a record in this process's metrics file (one per step, flushed at
once), so the doctor needs no hook in the loops: it watches the file's modification time. After
``stall_timeout_s`` without one it

- writes every thread's stack (``sys._current_frames``) to ``stall_{role}_{pid}_{n}.txt`` in the run
  folder, after a diagnosis: which part waits on what, read from the stacks themselves (the frame of a
  known waiting call and its arguments), e.g. "trainer waits for 16 experiences from the buffer
  sqlite:///... for 610 s; the explore process last wrote a record 420 s ago (metrics.explore.jsonl)",
  "explorer waits for weights version 7 (the rollout model has 6)", "3 workflows in flight: task ids
  train:3 (610 s), ...", overrun environment calls still running (``envs/calls.py``);
- logs the same (diagnosis and stacks) as a warning;
- does nothing else: it never stops the run. It reports again after every further ``stall_timeout_s``
  without progress, and stays quiet once steps finish again.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["StallDoctor", "diagnose", "stall_doctor"]


def stall_doctor(cfg, run_dir: Path, progress_file: Path, role: str | None = None) -> StallDoctor | None:
    """The doctor of one stage (None when ``monitor.stall_timeout_s`` is 0 or the stage serves)."""
    seconds = cfg.monitor.stall_timeout_s
    if not seconds or cfg.mode == "serve":
        return None
    return StallDoctor(run_dir, seconds, progress_file, role=role)


class StallDoctor:
    """A daemon thread that reports a stall (see the module docstring); use it as a context manager."""

    def __init__(self, run_dir: Path, seconds: float, progress_file: Path, role: str | None = None):
        self.run_dir = Path(run_dir)
        self.seconds = seconds
        self.progress_file = Path(progress_file)
        self.role = role or "run"
        self.reports: list[Path] = []
        self._stop = threading.Event()
        self._started = time.time()
        self._thread = threading.Thread(target=self._watch, name="stall-doctor", daemon=True)

    def __enter__(self) -> StallDoctor:
        self._started = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def last_progress(self) -> float:
        """Unix time of the newest step record of this process (the doctor's start when there is none)."""
        try:
            return max(self._started, self.progress_file.stat().st_mtime)
        except FileNotFoundError:
            return self._started

    def _watch(self) -> None:
        reported_at = 0.0  # the stall already reported (its last progress time) and how often
        times = 0
        poll = min(max(self.seconds / 10, 0.1), 5.0)
        while not self._stop.wait(poll):
            last = self.last_progress()
            idle = time.time() - last
            if last != reported_at:
                reported_at, times = last, 0
            if idle >= self.seconds * (times + 1):
                times += 1
                try:
                    self.report(idle)
                except Exception:  # the doctor must never be what breaks the run
                    log.exception("stall doctor: writing the report failed")

    def report(self, idle: float) -> Path:
        """Write the stall report now; returns its path."""
        lines = [
            f"trivium stall doctor: no step finished for {idle:.0f} s (monitor.stall_timeout_s = "
            f"{self.seconds:g}); newest record {self._record_age()}. The run goes on; this report says "
            "what each part is doing.",
            "",
            "What each part waits on:",
            *[f"  - {x}" for x in diagnose(self.run_dir)],
            "",
        ]
        text = "\n".join(lines) + "\n" + stacks()
        path = self.run_dir / f"stall_{self.role}_{os.getpid()}_{len(self.reports) + 1}.txt"
        path.write_text(text)
        self.reports.append(path)
        log.warning("%s\n(written to %s)", text, path)
        return path

    def _record_age(self) -> str:
        if not self.progress_file.exists():
            return f"none yet in {self.progress_file.name}"
        return f"{time.time() - self.progress_file.stat().st_mtime:.0f} s ago in {self.progress_file.name}"


def stacks() -> str:
    """Every thread's stack, innermost call last, headed by the thread's name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, '?')} ({ident}) ---")
        out.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- diagnosis
def diagnose(run_dir: Path | None = None) -> list[str]:
    """One line per thread that waits on something the doctor knows, plus overrun environment calls."""
    from trivium.envs.calls import hung_calls

    names = {t.ident: t.name for t in threading.enumerate()}
    found: dict[tuple[str, str], list[str]] = {}  # (part, wait) -> thread names
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        frames = list(_frames(frame))
        line = _first_wait(frames, run_dir)
        if line is not None:
            name = names.get(ident, "?")
            found.setdefault((_part(name, frames), line), []).append(name)
    out = []
    for (part, line), threads in found.items():
        who = threads[0] if len(threads) == 1 else f"{len(threads)} threads"
        out.append(f"{part} ({who}): {line}")
    for what, seconds in hung_calls():
        out.append(f"environment call {what} overran its env_timeout_s and still runs after {seconds:.0f} s")
    return out or ["no thread waits on anything the doctor knows; see the stacks below"]


def _frames(frame: FrameType | None) -> Iterator[FrameType]:
    """Innermost first."""
    while frame is not None:
        yield frame
        frame = frame.f_back


def _part(name: str, frames: list[FrameType]) -> str:
    """Which component a thread belongs to, from the outermost function that tells."""
    codes = {f.f_code.co_qualname for f in frames}
    for qualname, part in (
        ("explore_loop", "explore process"),
        ("ExplorerThread._run", "explorer (running ahead)"),
        ("Explorer.explore_step", "explorer"),
        ("RemoteExplorer.explore_step", "explorer (Ray actor)"),
        ("Explorer.evaluate", "evaluation"),
        ("train_loop", "trainer"),
        ("bench_loop", "bench"),
    ):
        if qualname in codes:
            return part
    if name.startswith("workflow"):
        return "workflow"
    if name.startswith("env-"):
        return "environment call"
    return "thread"


def _first_wait(frames: list[FrameType], run_dir: Path | None) -> str | None:
    """The first rule (in ``WAITS`` order) that matches a frame of this stack, with that frame's locals."""
    by_name = {}
    for f in frames:
        by_name.setdefault(f.f_code.co_qualname, f)
    for qualname, explain in WAITS:
        frame = by_name.get(qualname)
        if frame is None and qualname.startswith("*"):
            frame = next((f for q, f in by_name.items() if q.endswith(qualname[1:])), None)
        if frame is not None:
            try:
                return explain(frame.f_locals, run_dir)
            except Exception as error:  # a renamed local: still say where it waits
                return f"in {qualname} ({type(error).__name__} reading its state)"
    return None


def _age(run_dir: Path | None, role: str, who: str) -> str:
    """When the process of ``role`` last wrote a step record into this run folder."""
    if run_dir is None:
        return ""
    path = Path(run_dir) / f"metrics.{role}.jsonl"
    if not path.exists():
        return f"; no {who} has written to {Path(run_dir).name} (is it running?)"
    return f"; the {who} last wrote a record {time.time() - path.stat().st_mtime:.0f} s ago ({path.name})"


def _storage_read(loc: dict[str, Any], run_dir: Path | None) -> str:
    storage = loc.get("self")
    where = getattr(storage, "where", None) or getattr(storage, "path", "?")
    timeout, deadline = loc.get("timeout"), loc.get("deadline")
    limit = ""
    if isinstance(timeout, (int, float)) and isinstance(deadline, float):
        limit = f", for {timeout - (deadline - time.monotonic()):.0f} s; gives up after {timeout:g} s"
    return (
        f"waits for {loc['n']} experiences from the buffer {where} (consumer {loc.get('consumer')}{limit})"
        f"{_age(run_dir, 'explore', 'explore process')}"
    )


def _queue_get(loc: dict[str, Any], run_dir: Path | None) -> str:
    q = loc["self"]
    return (
        f"waits for {loc['n']} experiences from the in-process queue ({len(q._items)} queued; put "
        f"{q.total_put}, got {q.total_got} so far): is the explorer still producing?"
    )


def _queue_put(loc: dict[str, Any], run_dir: Path | None) -> str:
    q = loc["self"]
    return (
        f"waits for room for {len(loc['experiences'])} experiences in the in-process queue ({len(q._items)} "
        f"of {q.capacity} taken): the trainer is not taking them"
    )


def _pull(loc: dict[str, Any], run_dir: Path | None) -> str:
    engine = loc.get("engine") or getattr(loc.get("self"), "engine", None)
    has = f" (the rollout model has {engine.version})" if engine is not None else ""
    return f"waits for weights version {loc.get('at_least')}{has}{_age(run_dir, 'train', 'train process')}"


def _tasks(loc: dict[str, Any], run_dir: Path | None) -> str:
    running = loc["self"].in_flight()
    if not running:
        return "runs a batch of tasks (none in a workflow right now)"
    shown = ", ".join(f"{task} ({s:.0f} s)" for task, s in running[:8])
    more = f" and {len(running) - 8} more" if len(running) > 8 else ""
    return (
        f"{len(running)} workflow(s) in flight, the longest for {running[0][1]:.0f} s: task ids {shown}{more}"
    )


def _env_call(loc: dict[str, Any], run_dir: Path | None) -> str:
    return f"waits for environment call {loc.get('what')} (env_timeout_s {loc.get('timeout_s')})"


def _hang(loc: dict[str, Any], run_dir: Path | None) -> str:
    return "hangs in an injected fault (faults section of the config)"


WAITS: list[tuple[str, Callable[[dict[str, Any], Path | None], str]]] = [
    ("_hang", _hang),
    ("SqlStorage.read", _storage_read),
    ("JsonlStorage.read", _storage_read),
    ("ExperienceQueue.get", _queue_get),
    ("ExperienceQueue.put", _queue_put),
    ("*Sync.pull", _pull),
    ("Explorer.run_tasks", _tasks),
    ("RemoteExplorer._call", _tasks),
    ("call_with_timeout", _env_call),
    ("Trainer.train_step", lambda loc, _: "is training a step (train_step)"),
    ("BatchingRolloutModel.generate", lambda loc, _: "waits for its batch of the rollout model"),
]
