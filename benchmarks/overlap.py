"""Synchronous vs overlapping explorer/trainer on the quickstart's GRPO stage, side by side in one run.

    python benchmarks/overlap.py --model runs/quickstart/word-problems/checkpoints/sft/step_800/model

Runs the same GRPO stage (16 prompts x 8 samples, lr 2e-4, --steps steps) from the same SFT checkpoint
synchronous (sync_offset 0: explore, train, sync in turn), one step ahead (sync_offset 1: the explorer
samples step s+1 while the trainer trains step s) and fully asynchronous (sync_offset 4, never waiting
for weights within that window), the last two with and without truncated importance sampling for the
stale samples (algorithm.rollout_is_cap 2). Prints seconds per step, greedy test accuracy at the end,
and the ratios against the synchronous run. On 2 CPU cores both halves compete for the same cores, so
expect less overlap gain than on GPUs, where explorer and trainer sit on different devices.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "quickstart" / "data"
# label: (sync_offset, algorithm.rollout_is_cap)
SETTINGS = {
    "sync": (0, 0.0),
    "offset 1": (1, 0.0),
    "offset 1 + IS": (1, 2.0),
    "async (offset 4)": (4, 0.0),
    "async (offset 4) + IS": (4, 2.0),
}


def run(model: Path, steps: int, offset: int, is_cap: float, work: Path, name: str) -> dict:
    cfg = {
        "project": "overlap",
        "name": name,
        "checkpoint_root": str(work),
        "seed": 0,
        "model": {"path": str(model)},
        "explorer": {"rollout": {"max_tokens": 24}, "eval_interval": 0, "eval_at_start": False},
        "buffer": {
            "batch_size": 16,
            "total_steps": steps,
            "taskset": {"path": str(DATA / "train.jsonl"), "repeat_times": 8},
            "eval_tasksets": [{"path": str(DATA / "test.jsonl"), "name": "test"}],
        },
        "trainer": {"lr": 2e-4, "micro_batch_size": 128},
        "synchronizer": {"sync_offset": offset},
        "algorithm": {"rollout_is_cap": is_cap},
        "monitor": {"progress_bar": False},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows = [json.loads(x) for x in (work / "overlap" / name / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "train/step_seconds" in r]
    times = [r["time"] for r in steps_rows]
    per_step = [b - a for a, b in itertools.pairwise(times[:-1])]  # drop the first step and the final eval
    return {
        "s_per_step": statistics.median(per_step),
        "accuracy": [r["eval/test/accuracy"] for r in rows if "eval/test/accuracy" in r][-1],
        "staleness": statistics.mean(r.get("staleness/mean", 0.0) for r in steps_rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="SFT checkpoint folder (the quickstart's step_800/model)")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trivium-overlap-"))
    results = {}
    for i, (label, (offset, is_cap)) in enumerate(SETTINGS.items()):
        results[label] = run(Path(args.model), args.steps, offset, is_cap, work, f"run{i}")
        r = results[label]
        print(
            f"{label:18s} {r['s_per_step']:.3f} s/step  accuracy {r['accuracy']:.3f}  "
            f"mean staleness {r['staleness']:.2f}",
            flush=True,
        )
    base = results["sync"]["s_per_step"]
    print(
        f"\n| setting | median s/step | speed-up vs sync | accuracy after {args.steps} steps | mean staleness |"
    )
    print("|---|---|---|---|---|")
    for label, r in results.items():
        print(
            f"| {label} | {r['s_per_step']:.3f} | {base / r['s_per_step']:.2f}x | {r['accuracy']:.3f} | "
            f"{r['staleness']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
