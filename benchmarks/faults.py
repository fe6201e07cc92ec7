"""Learning under faults: the quickstart's GRPO stage clean, and with 30% of workflow runs raising and 5%
hanging, from the same SFT checkpoint, same steps; greedy accuracy of both on the 256 held-out problems.

    python benchmarks/faults.py                 # ~10 min on 2 cores once the SFT checkpoint exists
    python benchmarks/faults.py --seeds 0 1 2   # several seeds (run seed and fault seed), one pair each
    python benchmarks/faults.py --seeds 4 5 --merge   # more seeds, kept with the recorded ones

The SFT checkpoint is ``benchmarks/engines.py``'s ``quickstart_model`` (trained once into ``--work``,
default ``benchmarks/workdir``, ~3 min, then reused). Both runs of a pair use the same config (16 tasks x 8
samples, 24 tokens, lr 2e-4, ``explorer.workflow_timeout_s`` = ``--timeout``, ``runtime.num_threads`` =
``--threads``, ``explorer.max_retries`` = ``--retries``, 2: a raised attempt is tried again, a hung one is
not) but for the ``faults`` section: ``workflow_raise`` 0.3 and ``workflow_hang`` 0.05 (a hang
lasts 1.5 x the timeout, then the workflow stops at its model call). Evaluation is never faulted. A task that
still fails is dropped from its step, so the faulty run trains on fewer groups per step; the claim is that
it still learns to within 5 points of the clean run's final accuracy. (Without retries, 35% of the tasks
fail and one measured pair ended 6.2 points apart: 0.707 clean, 0.645 faulty.)

Reported per run: start and final greedy accuracy, failed tasks and injections (from the metrics),
failure records (``failures.jsonl``), experiences sampled and trained (sums of ``rollout/experiences`` and
``train/sequences``: equal means every good experience was trained, once), wall time. Writes
``benchmarks/results/faults.json`` and ``faults.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
from quickstart_grpo import grpo_config, grpo_shape, summary, total, write  # noqa: E402
from quickstart_grpo import run as run_config  # noqa: E402


def config(model: Path, work: Path, name: str, seed: int, args, faults: dict | None) -> Path:
    cfg, _ = grpo_config(
        model, work, project="bench-faults", name=name, seed=seed, threads=args.threads, steps=args.steps
    )
    cfg["explorer"].update(workflow_timeout_s=args.timeout, max_retries=args.retries)
    if faults:
        cfg["faults"] = {"seed": seed, **faults}
    return write(cfg, work)


def run(path: Path) -> dict:
    records, wall = run_config(path)
    steps, row = summary(records)
    failures = path.parent / "bench-faults" / path.stem / "failures.jsonl"
    keys = ("rollout/tasks", "rollout/failed_tasks", "rollout/retries", "faults/workflow_raise")
    tasks, failed, retries, raised = (total(steps, k) for k in keys)
    return {
        **row,
        "tasks": tasks,
        "failed_tasks": failed,
        "retries": retries,
        "injected_raise": raised,
        "injected_hang": total(steps, "faults/workflow_hang"),
        "failure_records": len(failures.read_text().splitlines()) if failures.exists() else 0,
        "experiences_sampled": total(steps, "rollout/experiences"),
        "experiences_trained": total(steps, "train/sequences"),
        "wall_s": round(wall, 1),
    }


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--work", default=str(REPO / "benchmarks" / "workdir"), help="SFT model and runs (reused)"
    )
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps (the quickstart's: 100)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--raise-rate", type=float, default=0.3)
    ap.add_argument("--hang-rate", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=2.0, help="explorer.workflow_timeout_s of both runs")
    ap.add_argument(
        "--retries",
        type=int,
        default=2,
        help="explorer.max_retries of both runs (a raised attempt is retried)",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="runtime.num_threads (1: fair on a shared machine)"
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the recorded rows of other seeds (run with the same settings) in the results files",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from engines import quickstart_model

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = quickstart_model(work)
    faults = {"workflow_raise": args.raise_rate, "workflow_hang": args.hang_rate}
    rows = []
    for seed in args.seeds:
        for kind, section in (("clean", None), ("faulty", faults)):
            name = f"{kind}-s{seed}"
            before = load_average()
            row = run(config(model, work, name, seed, args, section))
            row.update(kind=kind, seed=seed, load_before=before, load_after=load_average())
            rows.append(row)
            print(json.dumps(row), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    recorded = {**vars(args), "work": os.path.relpath(args.work, REPO)}  # no machine paths in results
    if args.merge and (RESULTS / "faults.json").exists():
        old = json.loads((RESULTS / "faults.json").read_text())
        settings = ("steps", "raise_rate", "hang_rate", "timeout", "retries", "threads")
        differ = [k for k in settings if old["args"].get(k) != recorded[k]]
        if differ:
            print(f"--merge: the recorded results were run with other {differ}; not merged", file=sys.stderr)
        else:
            rows = [r for r in old["rows"] if r["seed"] not in args.seeds] + rows
            recorded["seeds"] = sorted({r["seed"] for r in rows})
    (RESULTS / "faults.json").write_text(json.dumps({"args": recorded, "rows": rows}, indent=1))
    table = markdown(rows, args)
    (RESULTS / "faults.md").write_text(table)
    print("\n" + table)
    return 0


def markdown(rows: list[dict], args) -> str:
    tasks, group = grpo_shape()
    lines = [
        f"# benchmarks/faults.py ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {args.steps} GRPO "
        f"steps of {tasks} x {group}, workflow_timeout_s {args.timeout:g}, max_retries {args.retries}, "
        f"runtime.num_threads {args.threads})",
        "",
        "| run | seed | greedy accuracy start → final | injected raises + hangs (per attempt) | retries | "
        "failed tasks / tasks | "
        "failures.jsonl | experiences sampled / trained | wall s | load avg before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['seed']} | {r['start_accuracy']:.3f} → **{r['final_accuracy']:.3f}** | "
            f"{r['injected_raise']} + {r['injected_hang']} | {r['retries']} | {r['failed_tasks']} / {r['tasks']} | "
            f"{r['failure_records']} | {r['experiences_sampled']} / {r['experiences_trained']} | {r['wall_s']} | "
            f"{r['load_before']} / {r['load_after']} |"
        )
    by_seed: dict[int, dict[str, float]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {})[r["kind"]] = r["final_accuracy"]
    gaps = [v["clean"] - v["faulty"] for v in by_seed.values() if {"clean", "faulty"} <= set(v)]
    if gaps:
        lines += [
            "",
            "clean − faulty final accuracy: "
            + ", ".join(f"{100 * g:+.1f} points" for g in gaps)
            + f" (target: within 5 points; mean {100 * sum(gaps) / len(gaps):+.1f})",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
