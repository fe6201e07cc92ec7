"""The quickstart's GRPO stage as a benchmark run: one config from a given (SFT) model, run in its own
process, its metrics read back. Shared by the benchmarks that compare GRPO runs of the quickstart
(``faults.py``, ``selection.py``, ``long_tail.py``); each adjusts the stage for what it measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"
DATA = REPO / "examples" / "quickstart" / "data"


def grpo_shape() -> tuple[int, int]:
    """Tasks per step and samples per task of the quickstart's GRPO stage."""
    grpo = yaml.safe_load(QUICKSTART.read_text())["stages"][1]["buffer"]
    return grpo["batch_size"], grpo["taskset"]["repeat_times"]


def grpo_config(model: Path, work: Path, *, project: str, name: str, seed: int, threads: int, steps: int):
    """``(cfg, grpo)``: the quickstart's config reduced to its GRPO stage (``grpo``, adjust it in place),
    from ``model``, for ``steps`` steps, evaluated greedily on the 256 held-out problems at the start and the
    end, no checkpoints; write it with ``write``."""
    cfg = yaml.safe_load(QUICKSTART.read_text())
    grpo = cfg["stages"][1]
    cfg.update(project=project, name=name, checkpoint_root=str(work), seed=seed)
    cfg["model"] = {"path": str(model)}
    cfg["monitor"] = {"progress_bar": False}
    cfg["runtime"] = {"num_threads": threads}
    cfg["buffer"]["eval_tasksets"] = [{"path": str(DATA / "test.jsonl"), "name": "test"}]
    cfg["explorer"]["eval_interval"] = 0
    grpo["buffer"]["taskset"]["path"] = str(DATA / "train.jsonl")
    grpo["buffer"]["total_steps"] = steps
    grpo["explorer"]["eval_at_start"] = True
    grpo["trainer"]["save_interval"] = 0
    cfg["stages"] = [grpo]
    return cfg, grpo


def write(cfg: dict, work: Path) -> Path:
    path = work / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(path: Path, env: dict | None = None) -> tuple[list[dict], float]:
    """``trivium run`` of ``path`` in its own process: the run's metrics records and its wall seconds."""
    cfg = yaml.safe_load(path.read_text())
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"],
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{path.name} failed:\n{proc.stderr[-3000:]}")
    folder = Path(cfg["checkpoint_root"]) / cfg["project"] / cfg["name"]
    records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return records, wall


def summary(records: list[dict]) -> tuple[list[dict], dict]:
    """The run's training steps' records, and what every comparison reports of it: steps, and the greedy
    accuracy on the held-out problems at the start and the end."""
    steps = [r for r in records if "train/loss" in r or "train/skipped_steps" in r]
    evals = [r for r in records if "eval/test/accuracy" in r]
    return steps, {
        "steps": len(steps),
        "start_accuracy": evals[0]["eval/test/accuracy"],
        "final_accuracy": evals[-1]["eval/test/accuracy"],
    }


def total(steps: list[dict], key: str) -> int:
    """``key`` summed over the steps' records (a count per step)."""
    return int(sum(r.get(key, 0) for r in steps))
