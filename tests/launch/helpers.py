"""Helpers of the tests that run `trivium run` in a subprocess (killed and resumed runs), and of those
that run mode serve in a thread."""

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time


def trivium_run(path, kill_at="", *extra, timeout=300):
    """`trivium run -c PATH [extra]` with TRIVIUM_KILL_AT (trivium.faults); the CompletedProcess."""
    env = {**os.environ, "TRIVIUM_KILL_AT": kill_at or ""}
    return subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def partial_records(run_dir):
    """The records of a running run's metrics.jsonl (none before it exists; a line being written skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def comparable(records):
    """Metric records without the fields that depend on wall time, nor on how the engine holds its weights
    (``sync/shared_weights``: a local engine samples from the trainer's tensors, Ray's and DDP's hold copies;
    the same numbers either way, ``test_shared_weights.py``)."""
    drop = ("time", "seconds", "per_s", "rss", "sync/shared_weights")
    return [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in records]


def same_value(a, b) -> bool:
    """Equal, or for numbers equal up to the last of the 6 decimals metrics are written with: two processes
    can differ by one float ulp in a reduction, which flips that digit now and then (seen once in CI:
    5.505218 vs 5.505219). A resume that trains on another batch or loses optimizer state differs by far more."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1.5e-6)
    return a == b


def assert_same_records(got, ref):
    """The two runs' records are equal but for wall-time fields (numbers to the last written digit, see
    ``same_value``); a failure names the step and the keys."""
    got, ref = comparable(got), comparable(ref)
    assert [(r.get("stage"), r.get("step")) for r in got] == [(r.get("stage"), r.get("step")) for r in ref]
    for a, b in zip(got, ref):
        diff = {
            k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if not same_value(a.get(k), b.get(k))
        }
        assert not diff, f"stage {a.get('stage')} step {a.get('step')}: (resumed, reference) {diff}"


def without(records, *keys):
    """The records without ``keys`` (what differs between runs that should otherwise be equal)."""
    return [{k: v for k, v in r.items() if k not in keys} for r in records]


@contextlib.contextmanager
def serving(stage_config, run_dir, timeout=60):
    """Mode serve (``serve_mode.serve``) in a thread of this process; yields its ``serve.json`` once it is
    up, and stops it on the way out."""
    from trivium.launch.serve_mode import serve

    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(stage_config, run_dir), kwargs={"stop": stop})
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not (run_dir / "serve.json").exists():
            assert thread.is_alive(), "the server stopped before writing serve.json"
            assert time.monotonic() < deadline, f"no serve.json after {timeout} s"
            time.sleep(0.1)
        yield json.loads((run_dir / "serve.json").read_text())
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive(), "the server did not stop within 60 s"


def tiny_run_config(folder, model_dir, project, name, max_tokens=6):
    """The common part of an in-process test run's config: the tiny model, one CPU thread, no progress bar,
    short samples and no evaluation before the first step; the caller adds the stage's own sections."""
    return {
        "project": project,
        "name": name,
        "checkpoint_root": str(folder / "runs"),
        "model": {"path": str(model_dir)},
        "runtime": {"num_threads": 1},
        "monitor": {"progress_bar": False},
        "explorer": {"rollout": {"max_tokens": max_tokens}, "eval_at_start": False},
    }
