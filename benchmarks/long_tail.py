"""Long-tail control, side by side: the quickstart's GRPO stage behind an environment whose calls take a
heavy-tailed time (``benchmarks/long_tail_env.py``: 0.1-0.5 s, and 8% from a Pareto tail up to 60 s),
run synchronously, with ``explorer.dynamic_timeout``, and with ``explorer.over_rollout`` plus the dynamic
timeout; same SFT checkpoint, seed and steps.

    python benchmarks/long_tail.py                    # 40 steps of 16 x 8 a mode, ~15 min on 2 cores
    python benchmarks/long_tail.py --steps 100 --seeds 0 1 2
    python benchmarks/long_tail.py --modes sync --seeds 1 --merge   # add rows to the recorded ones

The delays are sleeps (no CPU, like waiting on a remote service), the same per task occurrence in every
mode. Reported per run: wall time, steps per hour, median and p95 step time, greedy accuracy on the 256
held-out problems at the start and the end, tasks timed out / cancelled, experiences trained; and the
ratio of each mode's steps per hour to the synchronous run's. Writes ``benchmarks/results/long_tail.json``
and ``long_tail.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
from quickstart_grpo import grpo_config, summary, total, write  # noqa: E402
from quickstart_grpo import run as run_config  # noqa: E402

MODES = {
    "sync": {},
    "dynamic timeout": {"dynamic_timeout": {"enable": True, "ratio": 3.0, "min_samples": 16}},
    "over-rollout + dynamic timeout": {
        "over_rollout": {"ratio": 1.25},
        "dynamic_timeout": {"enable": True, "ratio": 3.0, "min_samples": 16},
    },
}


def config(model: Path, work: Path, name: str, seed: int, args, explorer: dict) -> Path:
    cfg, grpo = grpo_config(
        model, work, project="bench-long-tail", name=name, seed=seed, threads=args.threads, steps=args.steps
    )
    cfg["explorer"].update(**explorer)
    grpo["buffer"]["batch_size"] = args.tasks
    grpo["buffer"]["taskset"]["workflow"] = "long_tail_env:LongTailMath"
    return write(cfg, work)


def run(path: Path, seed: int) -> dict:
    pythonpath = os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")])
    records, wall = run_config(path, env={"LONG_TAIL_SEED": str(seed), "PYTHONPATH": pythonpath})
    steps, row = summary(records)
    step_s = sorted(r["time/step"] for r in steps)
    return {
        **row,
        "step_s_median": round(statistics.median(step_s), 2),
        "step_s_p95": round(step_s[min(len(step_s) - 1, int(0.95 * len(step_s)))], 2),
        "steps_per_hour": round(3600 * len(steps) / sum(step_s), 1),
        "tasks": total(steps, "rollout/tasks"),
        "timed_out_tasks": total(steps, "rollout/timed_out_tasks"),
        "cancelled_tasks": total(steps, "rollout/cancelled_tasks"),
        "experiences_trained": total(steps, "train/sequences"),
        "wall_s": round(wall, 1),
    }


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"# benchmarks/long_tail.py ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {args.steps} "
        f"GRPO steps of {args.tasks} x 8, runtime.num_threads {args.threads})",
        "",
        "| mode | seed | steps/hour (× sync) | step s median / p95 | greedy accuracy start → final | "
        "timed out / cancelled / tasks | experiences trained | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    sync = {r["seed"]: r["steps_per_hour"] for r in rows if r["mode"] == "sync"}
    for r in rows:
        ratio = f" ({r['steps_per_hour'] / sync[r['seed']]:.2f}×)" if r["seed"] in sync else ""
        lines.append(
            f"| {r['mode']} | {r['seed']} | {r['steps_per_hour']}{ratio} | {r['step_s_median']} / "
            f"{r['step_s_p95']} | {r['start_accuracy']:.3f} → **{r['final_accuracy']:.3f}** | "
            f"{r['timed_out_tasks']} / {r['cancelled_tasks']} / {r['tasks']} | {r['experiences_trained']} | "
            f"{r['wall_s']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--work", default=str(REPO / "benchmarks" / "workdir"), help="SFT model and runs (reused)"
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tasks", type=int, default=16, help="tasks per step (8 samples each)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--threads", type=int, default=2, help="runtime.num_threads")
    ap.add_argument(
        "--merge", action="store_true", help="keep the recorded rows of the modes and seeds not run now"
    )
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from engines import quickstart_model

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = quickstart_model(work)
    rows = []
    for seed in args.seeds:
        for mode in args.modes:
            name = f"{mode.replace(' + ', '-').replace(' ', '-')}-s{seed}"
            row = run(config(model, work, name, seed, args, MODES[mode]), seed)
            row.update(mode=mode, seed=seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    recorded = {**vars(args), "work": os.path.relpath(args.work, REPO)}  # no machine paths in results
    if args.merge and (RESULTS / "long_tail.json").exists():
        old = json.loads((RESULTS / "long_tail.json").read_text())
        if any(old["args"][k] != recorded[k] for k in ("steps", "tasks", "threads")):
            print("--merge: the recorded rows were run with other steps, tasks or threads; not merged")
        else:
            ran = {(r["mode"], r["seed"]) for r in rows}
            rows = [r for r in old["rows"] if (r["mode"], r["seed"]) not in ran] + rows
            rows.sort(key=lambda r: (r["seed"], list(MODES).index(r["mode"])))
    (RESULTS / "long_tail.json").write_text(json.dumps({"args": recorded, "rows": rows}, indent=1))
    table = markdown(rows, args)
    (RESULTS / "long_tail.md").write_text(table)
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
