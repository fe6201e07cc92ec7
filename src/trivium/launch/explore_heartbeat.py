"""How the train process of a decoupled run knows what its explore process is doing.

The explore process keeps ``explore_heartbeat.{stage}.json`` in the run folder (``Heartbeat``): its host and
pid, the last step it wrote, the steps it will write, and its state: ``running`` (rewritten every
``HEARTBEAT_S`` seconds by a daemon thread, so a process that stops without a word, SIGKILL or the
out-of-memory killer, stops beating), ``finished`` or ``failed`` (with the error).

The train process, while a read of ``buffer.storage`` waits for a batch, looks at it (``ExploreWatch``,
called between the storage's polls):

- ``finished`` while the train process waits: the explore process has written every step it will write,
  and a batch is still missing (the train process asks for more steps than the explore process writes): the
  read fails at once, saying both counts, instead of waiting ``buffer.storage.read_timeout_s`` (600 s) for
  nothing. It fails on the second look, so a last step written just before the state changed is still read.
  A ``finished`` written before the train process started (an earlier run in the same folder, whose explore
  process may be about to start again with more steps) counts for nothing: the read waits as before.
- ``failed``, or ``running`` without a beat for ``STALE_S`` seconds: the explore process is gone, and a
  restarted one continues after its last written step (``launch/decoupled.py``). The train process logs
  what happened and how to restart it, at once, and keeps waiting for it until the read times out; the
  timeout's error then says what the explore process last did.

No heartbeat file (an explore process of an older version, a serve process, another writer): the read waits
as before. Both processes read the same run folder already (weights, metrics); a run whose processes share no
folder gets no watch.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from trivium.files import write_atomically

log = logging.getLogger(__name__)

__all__ = ["HEARTBEAT_S", "STALE_S", "ExploreProcessFinished", "ExploreWatch", "Heartbeat", "heartbeat_path"]

HEARTBEAT_S = 5.0  # how often the explore process rewrites its heartbeat
STALE_S = 60.0  # a running explore process this long without a beat is taken for gone


class ExploreProcessFinished(TimeoutError):
    """The explore process wrote every step it will write, and the train process still waits for a batch."""


def heartbeat_path(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / f"explore_heartbeat.{stage}.json"


class Heartbeat:
    """The explore process's side: ``start()``, ``wrote(step)`` after each written step, then ``finish()`` or
    ``fail(error)``."""

    def __init__(self, path: Path, first_step: int, total: int) -> None:
        self.path = path
        self._state: dict[str, Any] = {
            "state": "running",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "step": first_step,  # the last step written
            "total": total,
            "error": None,
        }
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="explore-heartbeat", daemon=True)

    def start(self) -> None:
        self._write()
        self._thread.start()

    def wrote(self, step: int) -> None:
        with self._lock:
            self._state["step"] = step

    def finish(self) -> None:
        self._end("finished", None)

    def fail(self, error: BaseException) -> None:
        self._end("failed", f"{type(error).__name__}: {error}"[:2000])

    def _end(self, state: str, error: str | None) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * HEARTBEAT_S)
        with self._lock:
            self._state.update(state=state, error=error)
        self._write()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._write()
            except OSError as error:  # a full disk must not end the explore process; the watch sees stale
                log.warning("explore heartbeat %s could not be written: %s", self.path, error)

    def _write(self) -> None:
        with self._lock:
            record = {**self._state, "beat": time.time()}
        write_atomically(self.path, json.dumps(record))


class ExploreWatch:
    """The train process's side: called between a read's polls (``ExperienceStorage.read(waiting=...)``);
    looks at the heartbeat every ``HEARTBEAT_S`` seconds at most."""

    def __init__(
        self, path: Path, stage: str, command_hint: str = "trivium run -c CONFIG --set mode=explore"
    ):
        self.path = path
        self.stage = stage
        self.command_hint = command_hint
        self._since = (
            process_started()
        )  # a 'finished' written before it counts for nothing (an earlier run's)
        self._next_look = 0.0
        self._finished_seen = False
        self._told: str | None = None  # the gone state last logged, so it is logged once

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + HEARTBEAT_S
        beat = self.read()
        if beat is None:
            return
        if beat["state"] == "finished" and float(beat.get("beat", 0)) >= self._since:
            if self._finished_seen:  # a read was tried after the state changed: nothing more will come
                raise ExploreProcessFinished(
                    f"the explore process of stage {self.stage!r} ({beat['pid']} on {beat['host']}) finished "
                    f"after writing step {beat['step']} of {beat['total']}, and this train process still waits "
                    "for a batch: it trains more steps than the explore process writes. Give both processes "
                    "the same config (buffer.total_steps / total_epochs, batch_size, repeat_times), or start "
                    "the explore process again with more steps"
                )
            self._finished_seen = True
            return
        self._finished_seen = False
        gone = self.gone(beat)
        if gone and gone != self._told:
            log.warning(
                "%s. Restart it (%s): it continues after step %d. This train process waits for it until "
                "buffer.storage.read_timeout_s.",
                gone,
                self.command_hint,
                beat["step"],
            )
        self._told = gone

    def read(self) -> dict[str, Any] | None:
        try:
            beat = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or being replaced (atomic: a retry sees a whole one)
            return None
        return beat if isinstance(beat, dict) and "state" in beat else None

    def gone(self, beat: dict[str, Any]) -> str | None:
        """Why the explore process is taken for gone (None: running, or finished)."""
        who = f"the explore process of stage {self.stage!r} ({beat.get('pid')} on {beat.get('host')})"
        if beat["state"] == "failed":
            return f"{who} failed after writing step {beat.get('step')}: {beat.get('error')}"
        silent = time.time() - float(beat.get("beat", 0))
        if beat["state"] == "running" and silent > STALE_S:
            return (
                f"{who} has sent no heartbeat for {silent:.0f} s (last written step {beat.get('step')}): "
                "it was killed or its machine is gone"
            )
        return None

    def describe(self) -> str:
        """What the explore process last said, for a timeout's error ('' without a heartbeat)."""
        beat = self.read()
        if beat is None:
            return f"no explore process heartbeat at {self.path}"
        return self.gone(beat) or (
            f"the explore process of stage {self.stage!r} is {beat['state']} (last written step {beat['step']} "
            f"of {beat['total']})"
        )


def process_started() -> float:
    """When this process started (epoch seconds; Linux: ``/proc/self/stat`` and the boot time), else now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
