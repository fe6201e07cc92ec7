"""The trackers of one process of a run, fed by ``MetricsWriter`` after each record is in the metrics file.

Each record becomes scalars at the run's global step: its numeric values, without ``step``,
``global_step`` and ``time`` (a bench record's keys get ``bench/{model}/`` in front: every model is
evaluated at the same global step). A (key, step) that a tracker already has is not sent again, neither in
this process (a stage's start-of-stage eval shares the previous stage's last global step) nor after a
resume: a resumed run re-runs the steps after its checkpoint and drops them from ``metrics.jsonl`` to write
them again, while a tracker keeps what it was sent (W&B drops steps below its last; MLflow and TensorBoard
would show a step twice). So the trackers keep the values first logged for those few steps; an exact resume
computes the same values again (timings aside), and ``metrics.jsonl`` holds the re-run's.

What each tracker needs to continue its run (``saved``: the W&B run id, the MLflow run id) and the last step
sent per key are kept in ``trackers.json`` in the run folder (``trackers.{role}.json`` for the processes of a
decoupled run), rewritten atomically after every record.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from trivium.files import write_atomically
from trivium.monitor.trackers import TRACKERS, Tracker, TrackerContext

log = logging.getLogger(__name__)

NOT_SCALARS = frozenset({"step", "global_step", "time"})


def tracker_state_path(run_dir: str | Path, role: str | None = None) -> Path:
    return Path(run_dir) / ("trackers.json" if role is None else f"trackers.{role}.json")


class TrackerSet:
    """The trackers named in ``monitor.backends`` (``jsonl`` is the metrics file itself, not a tracker).

    ``replay``: the metrics file(s) of this process; each tracker is sent, when it opens, the records in
    them that it does not have (a tracker added to a running run, or one whose library lost what it was
    sent when the process was killed)."""

    def __init__(
        self,
        monitor,
        run_dir: str | Path,
        *,
        project: str,
        name: str,
        role: str | None = None,
        resolved: dict[str, Any] | None = None,
        replay: Path | None = None,
    ):
        self.path = tracker_state_path(run_dir, role)
        state = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.trackers: list[tuple[str, Tracker]] = []
        self.state: dict[str, dict[str, Any]] = {}
        self.durable: dict[str, dict[str, Any]] = {}  # what is safe to persist for each tracker
        old = _records(replay)
        for backend in dict.fromkeys(monitor.backends):  # in order, each once
            if backend == "jsonl":
                continue
            entry = state.get(backend, {"saved": {}, "logged": {}})
            context = TrackerContext(
                run_dir=Path(run_dir),
                project=project,
                name=name if role is None else f"{name}-{role}",
                role=role,
                monitor=monitor,
                args=dict(monitor.backend_args.get(backend, {})),
                saved=entry["saved"],
            )
            tracker = TRACKERS.get(backend)(context)
            self.trackers.append((backend, tracker))
            self.state[backend] = entry
            self.durable[backend] = json.loads(json.dumps(entry))
            if entry["saved"] and not tracker.durable:  # what its own store got before a kill counts too
                for key, step in tracker.already_logged().items():
                    entry["logged"][key] = max(step, entry["logged"].get(key, -1))
            continuing = bool(entry["logged"])
            if not entry.get("config_logged") and resolved is not None:  # once per tracker run
                tracker.log_config(resolved)
                entry["config_logged"] = True
            replayed = sum(self._send(backend, tracker, record) for record in old)
            log.info(
                "metrics also go to %s%s%s",
                backend,
                " (continuing its run)" if continuing else "",
                f"; {replayed} earlier record(s) sent from the metrics file" if replayed else "",
            )
        self._save()

    def log(self, record: dict[str, Any]) -> None:
        if any([self._send(backend, tracker, record) for backend, tracker in self.trackers]):
            self._save()

    def _send(self, backend: str, tracker: Tracker, record: dict[str, Any]) -> bool:
        """Send ``record``'s scalars that ``tracker`` does not have yet; whether it sent any."""
        step = record.get("global_step")
        if not isinstance(step, int):
            return False
        prefix = f"bench/{record['model']}/" if "model" in record else ""
        logged = self.state[backend]["logged"]
        new = {
            prefix + k: float(v)
            for k, v in record.items()
            if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        new = {k: v for k, v in new.items() if logged.get(k, -1) < step}
        if new:
            tracker.log(step, new)
            logged.update(dict.fromkeys(new, step))
        return bool(new)

    def close(self, failed: bool = False) -> None:
        for backend, tracker in self.trackers:
            tracker.close(failed)
            self.durable[backend] = self.state[backend]  # closed: everything sent is written
        self._save()
        self.trackers = []

    def _save(self) -> None:
        """Persist each tracker's state: all of it for a tracker whose ``log`` writes through, and for one
        that buffers (wandb: its service writes when the run finishes) only what it had at its last close."""
        if not self.state:
            return
        for backend, tracker in self.trackers:
            if tracker.durable:
                self.durable[backend] = self.state[backend]
            else:  # its ids are safe at once (the same run continues), its steps only once closed
                self.durable[backend] = {**self.durable[backend], "saved": self.state[backend]["saved"]}
        write_atomically(self.path, json.dumps(self.durable))


def _records(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
