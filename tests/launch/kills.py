"""Helpers of the fault tests: a `trivium run` in a subprocess killed with SIGKILL at a seeded random
moment, and the run configs they share (tiny model, word problems, a checkpoint every step)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml


def grpo_config(tmp_path: Path, model_dir: Path, data_dir: Path, name: str, *, steps: int, **top) -> dict:
    """Mode both on the word problems from the tiny model: 2 tasks x 3 samples a step, checkpoint every step."""
    cfg = {
        "project": "faults",
        "name": name,
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {"rollout": {"max_tokens": 6}, "eval_interval": 4, "eval_at_start": False},
        "monitor": {"progress_bar": False},
        "runtime": {"num_threads": 1},  # two runs side by side on 2 cores (docs/sharing.md)
        "buffer": {
            "batch_size": 2,
            "total_steps": steps,
            "taskset": {"path": str(data_dir / "train.jsonl"), "repeat_times": 3},
            "eval_tasksets": [{"path": str(data_dir / "test.jsonl"), "name": "test", "max_rows": 4}],
        },
        "trainer": {"save_interval": 1, "keep_checkpoints": 3},
    }
    for key, value in top.items():  # sections merged one level deep
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_dir(tmp_path: Path, name: str) -> Path:
    return tmp_path / "runs" / "faults" / name


def start(path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), *extra],
        env={**os.environ, "TRIVIUM_KILL_AT": "", **(env or {})},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return err


def records_in(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def kill_at_random_moment(
    proc: subprocess.Popen, progress: Path, rng: random.Random, records: tuple[int, int], timeout: float = 300
) -> str:
    """SIGKILL ``proc`` at a random point of the step after record k of ``progress`` (a metrics file), k drawn
    from ``records`` (inclusive; at most the run's steps - 2, so that a step is left after the next record):
    once k records are there, after a random fraction of the time a step took before it, and at the latest
    when record k + 1 appears. Any point of a step (sampling, training, writing the checkpoint or the
    record). A delay in seconds fixed in advance can outlast the whole run: a tiny model's 8 steps have
    taken 0.6 s. Returns where it was killed, for the failure message."""
    k = rng.randint(*records)
    fraction = rng.random()
    deadline = time.monotonic() + timeout
    seen, seen_at, step_s = 0, time.monotonic(), 0.2  # 0.2 s: the first record's step (it holds the start)
    while seen < k:
        assert proc.poll() is None, f"the run ended before record {k}: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no record {k} in {progress} after {timeout} s"
        time.sleep(0.01)
        now = records_in(progress)
        if now > seen:
            if seen:
                step_s = (time.monotonic() - seen_at) / (now - seen)
            seen, seen_at = now, time.monotonic()
    kill_at = seen_at + fraction * step_s
    while time.monotonic() < kill_at and records_in(progress) == seen:
        time.sleep(0.01)
    where = f"killed {time.monotonic() - seen_at:.2f} s after record {seen} of {progress.name} (steps of {step_s:.2f} s)"
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"{where}, but the run had ended: {err[-3000:]}"
    return where


def final_explorer_state(run: Path, stage: str, step: int) -> dict:
    """The explorer's position (task set and group-id counter) in the checkpoint of ``step``."""
    state = torch.load(run / "checkpoints" / stage / f"step_{step}" / "trainer_state.pt", weights_only=True)
    explorer = state["resume"]["explorer"]
    return {"taskset": explorer["taskset"], "next_group_id": explorer["next_group_id"]}
