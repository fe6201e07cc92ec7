"""Metrics: one JSON line per record in the run folder (always), a console progress bar per stage, and a
log line for the whole run (``RunProgress``: stage k of n, time left).

Each record carries ``stage``, ``step`` (within the stage) and ``global_step`` (across stages), so one
file holds a multi-stage run's whole learning curve. A run in one process writes ``metrics.jsonl``; the
processes of a decoupled run (mode explore, train, serve on one run folder) each write their own file,
``metrics.{role}.jsonl``, so that a restarted process can drop what it wrote after its checkpoint
(``launch/resume.py``) without touching the records of a process that is still running. ``read_metrics``
reads them all.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trivium.files import rewrite_jsonl

if TYPE_CHECKING:
    from trivium.monitor.tracker_set import TrackerSet

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"

# What the progress bar shows, in order: (metric key suffix, short label)
_BAR_KEYS = (
    ("rollout/reward_mean", "reward"),
    ("rollout/accuracy", "acc"),
    ("train/loss", "loss"),
    ("sft/nll", "nll"),
)


def metrics_path(run_dir: str | Path, role: str | None = None) -> Path:
    """The metrics file of the process with ``role`` (None: the run's one process)."""
    return Path(run_dir) / (METRICS_FILE if role is None else f"metrics.{role}.jsonl")


class MetricsWriter:
    """Appends records to ``metrics_path(run_dir, role)``; the file is created by the first record.
    ``progress``: told of every record (the run-level progress line); ``trackers``: a ``TrackerSet`` that
    gets every record once it is in the file (``monitor.backends``)."""

    def __init__(
        self,
        run_dir: str | Path,
        role: str | None = None,
        progress: RunProgress | None = None,
        trackers: TrackerSet | None = None,
    ):
        self.path = metrics_path(run_dir, role)
        self.role = role
        self.progress = progress
        self.trackers = trackers
        self._file = None
        self._t0 = time.time()

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        clean.setdefault("time", round(time.time() - self._t0, 3))
        if self.role is not None:
            clean.setdefault("role", self.role)
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self.trackers is not None:
            self.trackers.log(clean)
        if self.progress is not None:
            self.progress.on_record(clean)

    def drop_after(self, global_step: int) -> int:
        """Drop this file's records after ``global_step`` (a resumed process writes them again); returns
        how many were dropped. The file is rewritten atomically and reopened at the next record."""
        self._close_file()
        return rewrite_jsonl(self.path, lambda record: record.get("global_step", 0) <= global_step)

    def close(self) -> None:
        """Close the file and the trackers (a tracker run ends failed when an exception is on its way)."""
        self._close_file()
        if self.trackers is not None:
            self.trackers.close(failed=sys.exc_info()[0] is not None)
            self.trackers = None

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, float):
        return round(v, 6)
    return v


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of the run folder: ``metrics.jsonl``, then each ``metrics.{role}.jsonl`` by name."""
    run_dir = Path(run_dir)
    paths = [p for p in [metrics_path(run_dir), *sorted(run_dir.glob("metrics.*.jsonl"))] if p.exists()]
    if not paths:
        raise FileNotFoundError(
            f"no {METRICS_FILE} in {run_dir}: is it a run folder (trivium run writes one)?"
        )
    records = []
    for path in paths:
        with path.open() as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


class Progress:
    """A tqdm bar per stage showing the key numbers of the latest step (and the latest eval accuracy)."""

    def __init__(self, stage: str, total: int, initial: int = 0, enabled: bool = True):
        self.bar = None
        self._redirect = None
        if enabled:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(total=total, initial=initial, desc=stage, dynamic_ncols=True, leave=True)
            # log lines go through tqdm.write while the bar is shown: each on a line of its own, the bar
            # redrawn under it (written straight to the stream, they were glued to the end of the bar's line)
            self._redirect = logging_redirect_tqdm([logging.getLogger()])
            self._redirect.__enter__()
        self.eval_text = ""

    def update(self, metrics: dict[str, Any]) -> None:
        if self.bar is None:
            return
        self.note_eval(metrics)
        postfix = {label: f"{metrics[key]:.3f}" for key, label in _BAR_KEYS if key in metrics}
        if self.eval_text:
            postfix["eval_acc"] = self.eval_text
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def note_eval(self, metrics: dict[str, Any]) -> None:
        """Remember the latest eval accuracies; they are shown with every later step."""
        evals = [v for k, v in metrics.items() if k.startswith("eval/") and k.endswith("/accuracy")]
        if evals:
            self.eval_text = " ".join(f"{v:.3f}" for v in evals)
            if self.bar is not None:
                self.bar.set_postfix({"eval_acc": self.eval_text})

    def close(self) -> None:
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        if self.bar is not None:
            self.bar.close()


class RunProgress:
    """The whole run in one log line: at each stage start and about ``lines_per_stage`` times a stage,

        run: stage 1/2 sft, step 80/800 (run 80/900 steps), 0:22 elapsed, ~2:45 left in the stage,
        ~3:08 in the run                                                  (one line in the log)

    ``stages``: (name, planned steps) in order; None for stages without steps (bench, serve), which the
    estimate leaves out. The stage's time left is its remaining steps at the pace measured in this stage
    since it started here (its evals, syncs and start-up included); later stages are counted at that pace
    too, a guess (a quickstart GRPO step takes as long as 2.6 SFT steps) that each stage corrects once it
    runs. A resumed stage measures from its first new step. ``clock``: seconds, monotonic (tests pass
    their own).
    """

    def __init__(
        self,
        stages: list[tuple[str, int | None]],
        lines_per_stage: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stages = list(stages)
        self.lines_per_stage = lines_per_stage
        self.clock = clock
        self.t0 = clock()
        self.index = -1
        self._start = self.t0
        self._first: int | None = None  # the first step this process ran in the stage
        self._last = 0

    def start_stage(self, index: int) -> str:
        self.index, self._start, self._first, self._last = index, self.clock(), None, 0
        name, steps = self.stages[index]
        done = sum(n or 0 for _, n in self.stages[:index])
        planned = f"{steps} steps" if steps is not None else "no steps"
        line = (
            f"run: stage {index + 1}/{len(self.stages)} {name} starts ({planned}); run {done}/{self._known} "
            f"steps done, {_clock_text(self.clock() - self.t0)} elapsed"
        )
        log.info("%s", line)
        return line

    def on_record(self, record: dict[str, Any]) -> str | None:
        """Note a metrics record; returns (and logs) the progress line when one is due."""
        if self.index < 0:
            return None
        name, steps = self.stages[self.index]
        step = record.get("step")
        if record.get("stage") != name or not steps or not isinstance(step, int) or step <= self._last:
            return None
        if self._first is None:
            self._first = step
        self._last = step
        every = max(1, math.ceil(steps / self.lines_per_stage))
        if step % every and step != steps:
            return None
        line = self.line(step)
        log.info("%s", line)
        return line

    def line(self, step: int) -> str:
        name, steps = self.stages[self.index]
        now = self.clock()
        pace = (now - self._start) / (step - (self._first or step) + 1)  # seconds per step, this stage
        later = self.stages[self.index + 1 :]
        stage_left = max(0, (steps or 0) - step) * pace
        run_left = stage_left + sum(n or 0 for _, n in later) * pace
        done = sum(n or 0 for _, n in self.stages[: self.index]) + step
        unknown = [n for n, steps_ in later if steps_ is None]
        text = (
            f"run: stage {self.index + 1}/{len(self.stages)} {name}, step {step}/{steps} (run {done}/"
            f"{self._known} steps), {_clock_text(now - self.t0)} elapsed, ~{_clock_text(stage_left)} left "
            f"in the stage, ~{_clock_text(run_left)} in the run"
        )
        return text + (f" (not counting {', '.join(unknown)})" if unknown else "")

    @property
    def _known(self) -> int:
        return sum(n or 0 for _, n in self.stages)


def _clock_text(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour."""
    s = round(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"
