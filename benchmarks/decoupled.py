"""The quickstart's GRPO stage as two processes: `trivium run --set mode=explore` and `--set mode=train`.

    python benchmarks/decoupled.py --model runs/quickstart/word-problems/checkpoints/sft/step_800/model

Both processes share a run folder: experiences go through a SQLite buffer, weights through versioned
safetensors files (strictly on-policy: sync_interval 1). The explore process evaluates greedy test accuracy
at the start and at the end. Prints the accuracy gain, the wall time, and the buffer's counts.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "quickstart" / "data"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trivium-decoupled-"))
    cfg = {
        "project": "decoupled",
        "name": "grpo",
        "checkpoint_root": str(work),
        "seed": 0,
        "model": {"path": str(Path(args.model).resolve())},
        "explorer": {"rollout": {"max_tokens": 24}, "eval_interval": 0, "eval_at_start": True},
        "buffer": {
            "batch_size": 16,
            "total_steps": args.steps,
            "storage": {},
            "taskset": {"path": str(DATA / "train.jsonl"), "repeat_times": 8},
            "eval_tasksets": [{"path": str(DATA / "test.jsonl"), "name": "test"}],
        },
        "trainer": {"lr": 2e-4, "micro_batch_size": 128, "save_interval": 10},
        "synchronizer": {"method": "checkpoint", "sync_interval": 1},
        "monitor": {"progress_bar": False},
    }
    path = work / "grpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set"]
    t0 = time.perf_counter()
    explore = subprocess.Popen([*cmd, "mode=explore"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    train = subprocess.run([*cmd, "mode=train"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    explore.wait()
    seconds = time.perf_counter() - t0
    if train.returncode or explore.returncode:
        print(f"failed: train exit {train.returncode}, explore exit {explore.returncode}; see {work}")
        return 1
    run_dir = work / "decoupled" / "grpo"
    from trivium.monitor.metrics import read_metrics

    rows = read_metrics(run_dir)
    accs = [r["eval/test/accuracy"] for r in rows if "eval/test/accuracy" in r]
    from trivium.buffer.storage_sql import SqlStorage

    storage = SqlStorage(run_dir / "buffer.sqlite")
    print(
        f"explore + train processes, {args.steps} steps: test accuracy {accs[0]:.3f} -> {accs[-1]:.3f} "
        f"({accs[-1] - accs[0]:+.3f}) in {seconds:.0f} s; buffer: {storage.count()} written, "
        f"{storage.count('consumed')} trained, {storage.count('ready')} left"
    )
    storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
