"""Two runs on one machine: each alone, two at once taking every core, two at once with runtime.num_threads.

    python benchmarks/shared_machine.py            # ~4 min on 2 CPU cores

The workload is the quickstart's SFT stage (64 demonstrations a step, the ~1M model), ``--steps`` steps per
run; a run's speed is the median of its ``train/step_seconds`` (the first 5 steps dropped). Rows:
- one run alone, every core (the reference);
- two runs at once, each taking every core (no ``runtime.num_threads``: what a user gets by default);
- two runs at once with ``runtime.num_threads: cores / 2`` each.
The target: each of two runs with their share of the cores within 2x of a lone run's s/step.

Writes ``benchmarks/results/shared_machine.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"


def config(work: Path, name: str, steps: int, threads: int | None) -> Path:
    cfg = yaml.safe_load(QUICKSTART.read_text())
    cfg.update(project="shared", name=name, checkpoint_root=str(work), monitor={"progress_bar": False})
    cfg["stages"] = [cfg["stages"][0]]
    cfg["stages"][0]["buffer"]["total_steps"] = steps
    if threads:
        cfg["runtime"] = {"num_threads": threads}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg).replace("data/", str(QUICKSTART.parent / "data") + "/"))
    return path


def launch(path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def s_per_step(work: Path, name: str) -> float:
    from trivium.monitor.metrics import read_metrics

    rows = [r for r in read_metrics(work / "shared" / name) if "train/step_seconds" in r]
    return statistics.median(r["train/step_seconds"] for r in rows[5:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="trivium-shared-"))
    rows = []

    def together(names: list[str], threads: int | None) -> list[float]:
        procs = [launch(config(work, n, args.steps, threads)) for n in names]
        for p in procs:
            _, err = p.communicate()
            if p.returncode:
                raise SystemExit(err[-2000:])
        return [s_per_step(work, n) for n in names]

    t0 = time.time()
    (alone,) = together(["alone"], None)
    rows.append(("one run alone, every core", alone, [alone]))
    rows.append(("two runs at once, each every core", None, together(["a-all", "b-all"], None)))
    share = max(1, cores // 2)
    rows.append(
        (
            f"two runs at once, runtime.num_threads: {share} each",
            None,
            together(["a-share", "b-share"], share),
        )
    )
    lines = [
        f"# benchmarks/shared_machine.py ({time.strftime('%Y-%m-%d')}, {cores} CPU cores, "
        f"{args.steps} SFT steps of the quickstart per run, {time.time() - t0:.0f} s)",
        "",
        "| runs | s/step of each run | vs one run alone |",
        "|---|---|---|",
    ]
    for label, _, times in rows:
        each = " / ".join(f"{t:.3f}" for t in times)
        ratios = " / ".join(f"{t / alone:.2f}x" for t in times)
        lines.append(f"| {label} | {each} | {ratios} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "benchmarks" / "results" / "shared_machine.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
