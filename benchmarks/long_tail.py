"""Long-tail control, side by side: the quickstart's GRPO stage behind an environment whose calls take a
heavy-tailed time (``benchmarks/long_tail_env.py``: 0.1-0.5 s, and 8% from a Pareto tail up to 60 s),
run synchronously, with ``explorer.dynamic_timeout``, with ``explorer.over_rollout`` plus the dynamic
timeout, and with both plus partial rollouts (the explorer a step ahead, ``synchronizer.sync_offset: 1``,
its running generations taking each sync's weights: ``explorer.rollout.in_flight_updates``); same SFT
checkpoint, seed and steps.

    python benchmarks/long_tail.py                    # 40 steps of 16 x 8 a mode, ~15 min on 2 cores
    python benchmarks/long_tail.py --steps 100 --seeds 0 1 2
    python benchmarks/long_tail.py --modes sync --seeds 1 --merge   # add rows to the recorded ones

The delays are sleeps (no CPU, like waiting on a remote service), the same per task occurrence in every
mode. Reported per run: wall time, steps per hour, median and p95 step time, greedy accuracy on the 256
held-out problems at the start and the end, tasks timed out / cancelled, experiences trained; and the
ratio of each mode's steps per hour to the synchronous run's; per mode over its seeds, the final accuracy's
mean and spread and the step seconds until the training reward (5-step mean) first reached 0.5. Writes
``benchmarks/results/long_tail.json``, ``long_tail.md`` and ``long_tail.png`` (training reward against
experiences trained and against step seconds); ``--plot-only`` redraws the last two from the JSON.
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

DYNAMIC = {"dynamic_timeout": {"enable": True, "ratio": 3.0, "min_samples": 16}}
MODES = {  # sections of the config each mode changes (merged into the quickstart's GRPO stage)
    "sync": {},
    "dynamic timeout": {"explorer": DYNAMIC},
    "over-rollout + dynamic timeout": {"explorer": {"over_rollout": {"ratio": 1.25}, **DYNAMIC}},
    # the explorer one step ahead of the trainer (sync_offset 1): a sync waits for the running generations
    "over-rollout + dynamic timeout + one step ahead": {
        "explorer": {"over_rollout": {"ratio": 1.25}, **DYNAMIC},
        "synchronizer": {"sync_offset": 1},
    },
    # ... and its running generations take each sync's weights at their next token
    "over-rollout + dynamic timeout + partial rollouts": {
        "explorer": {"over_rollout": {"ratio": 1.25}, **DYNAMIC, "rollout": {"in_flight_updates": True}},
        "synchronizer": {"sync_offset": 1},
    },
    # ... with each token's importance weight min(pi_trainer / pi_sampler, 2) (algorithm.rollout_is_cap)
    "partial rollouts + rollout correction": {
        "explorer": {"over_rollout": {"ratio": 1.25}, **DYNAMIC, "rollout": {"in_flight_updates": True}},
        "synchronizer": {"sync_offset": 1},
        "algorithm": {"rollout_is_cap": 2.0},
    },
}


def merged(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` merged in, section by section (a nested dict updates, a value replaces)."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def config(model: Path, work: Path, name: str, seed: int, args, changes: dict) -> Path:
    cfg, grpo = grpo_config(
        model, work, project="bench-long-tail", name=name, seed=seed, threads=args.threads, steps=args.steps
    )
    cfg.update(merged(cfg, changes))
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
        "curve": curve(steps),
        "step_s_median": round(statistics.median(step_s), 2),
        "step_s_p95": round(step_s[min(len(step_s) - 1, int(0.95 * len(step_s)))], 2),
        "steps_per_hour": round(3600 * len(steps) / sum(step_s), 1),
        "tasks": total(steps, "rollout/tasks"),
        "timed_out_tasks": total(steps, "rollout/timed_out_tasks"),
        "cancelled_tasks": total(steps, "rollout/cancelled_tasks"),
        "experiences_trained": total(steps, "train/sequences"),
        "in_flight_weight_loads": max(
            (r.get("rollout/in_flight_weight_loads", 0.0) for r in steps), default=0
        ),
        "token_staleness_mean": round(statistics.mean(r.get("staleness/token_mean", 0.0) for r in steps), 3),
        "wall_s": round(wall, 1),
    }


TARGET = 0.5  # training reward (5-step mean) whose first crossing the table reports, in step seconds
SMOOTH = 5


def curve(steps: list[dict]) -> list[list[float]]:
    """Per training step: experiences trained so far, step seconds so far, the step's mean sample reward."""
    out, trained, seconds = [], 0.0, 0.0
    for r in steps:
        trained += r.get("train/sequences", 0.0)
        seconds += r["time/step"]
        out.append([trained, round(seconds, 2), round(r["rollout/reward_mean"], 4)])
    return out


def smoothed(points: list[list[float]]) -> list[float]:
    """The reward column as a trailing ``SMOOTH``-step mean."""
    rewards = [p[2] for p in points]
    return [statistics.mean(rewards[max(0, i - SMOOTH + 1) : i + 1]) for i in range(len(rewards))]


def seconds_to_target(row: dict) -> float | None:
    """Step seconds until the smoothed training reward first reached ``TARGET`` (None: it did not)."""
    points = row.get("curve") or []
    return next((p[1] for p, r in zip(points, smoothed(points)) if r >= TARGET), None)


def plot(rows: list[dict], path: Path) -> None:
    """Training reward against experiences trained (per sample: does a mode learn as well?) and against step
    seconds (per hour: does it learn sooner?), each mode's seeds averaged step by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for mode in MODES:
        runs = [r["curve"] for r in rows if r["mode"] == mode and r.get("curve")]
        if not runs:
            continue
        n = min(len(c) for c in runs)
        reward = [statistics.mean(smoothed(c)[i] for c in runs) for i in range(n)]
        trained = [statistics.mean(c[i][0] for c in runs) for i in range(n)]
        seconds = [statistics.mean(c[i][1] for c in runs) for i in range(n)]
        label = f"{mode} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        axes[0].plot(trained, reward, label=label)
        axes[1].plot(seconds, reward, label=label)
    axes[0].set_xlabel("experiences trained")
    axes[1].set_xlabel("step seconds (evaluation excluded)")
    for ax in axes:
        ax.set_ylabel(f"training reward ({SMOOTH}-step mean)")
        ax.axhline(TARGET, color="grey", lw=0.6, ls=":")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("benchmarks/long_tail.py: the quickstart's GRPO stage behind a heavy-tailed environment")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"# benchmarks/long_tail.py ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {args.steps} "
        f"GRPO steps of {args.tasks} x 8, runtime.num_threads {args.threads})",
        "",
        "| mode | seed | steps/hour (× sync) | step s median / p95 | greedy accuracy start → final | "
        "timed out / cancelled / tasks | experiences trained | in-flight loads / token staleness | "
        f"s to reward {TARGET} | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sync = {r["seed"]: r["steps_per_hour"] for r in rows if r["mode"] == "sync"}
    for r in rows:
        ratio = f" ({r['steps_per_hour'] / sync[r['seed']]:.2f}×)" if r["seed"] in sync else ""
        lines.append(
            f"| {r['mode']} | {r['seed']} | {r['steps_per_hour']}{ratio} | {r['step_s_median']} / "
            f"{r['step_s_p95']} | {r['start_accuracy']:.3f} → **{r['final_accuracy']:.3f}** | "
            f"{r['timed_out_tasks']} / {r['cancelled_tasks']} / {r['tasks']} | {r['experiences_trained']} | "
            f"{_in_flight(r)} | {_seconds(seconds_to_target(r))} | {r['wall_s']} |"
        )
    return "\n".join(lines + summary_rows(rows)) + "\n"


def summary_rows(rows: list[dict]) -> list[str]:
    """Per mode over its seeds: steps per hour (x sync), final accuracy mean and spread, seconds to target."""
    lines = [
        "",
        f"Per mode over its seeds (mean, and min-max across seeds; s to reward {TARGET}: mean of those that got there):",
        "",
        "| mode | seeds | steps/hour (× sync) | final greedy accuracy | s to reward |",
        "|---|---|---|---|---|",
    ]
    sync = statistics.mean([r["steps_per_hour"] for r in rows if r["mode"] == "sync"] or [float("nan")])
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        rate = statistics.mean(r["steps_per_hour"] for r in mine)
        final = [r["final_accuracy"] for r in mine]
        reached = [t for t in map(seconds_to_target, mine) if t is not None]
        lines.append(
            f"| {mode} | {len(mine)} | {rate:.0f} ({rate / sync:.2f}×) | {statistics.mean(final):.3f} "
            f"({min(final):.3f}-{max(final):.3f}) | "
            f"{_seconds(statistics.mean(reached) if reached else None)} ({len(reached)}/{len(mine)}) |"
        )
    return lines


def run_name(mode: str, seed: int) -> str:
    return f"{mode.replace(' + ', '-').replace(' ', '-')}-s{seed}"


def backfilled(row: dict, work: Path, steps: int) -> dict:
    """A row recorded before rows kept their curve, with the curve of its run folder's metrics when that
    folder still holds the same run (all ``steps`` steps, the same final accuracy)."""
    if row.get("curve"):
        return row
    path = work / "bench-long-tail" / run_name(row["mode"], row["seed"]) / "metrics.jsonl"
    if not path.exists():
        return row
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    found, again = summary(records)
    if len(found) != steps or again["final_accuracy"] != row["final_accuracy"]:
        return row
    return {**row, "curve": curve(found)}


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _in_flight(row: dict) -> str:
    """Weight loads inside running generations, and the mean staleness of a trained token (partial rollouts)."""
    loads = row.get("in_flight_weight_loads", 0)
    return f"{loads:g} / {row['token_staleness_mean']:.2f}" if loads else "–"


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
    ap.add_argument("--plot-only", action="store_true", help="redraw the table and the plot from the JSON")
    args = ap.parse_args()
    if args.plot_only:
        recorded = json.loads((RESULTS / "long_tail.json").read_text())
        args.steps, args.tasks, args.threads = (recorded["args"][k] for k in ("steps", "tasks", "threads"))
        rows = [backfilled(row, Path(args.work).resolve(), args.steps) for row in recorded["rows"]]
        (RESULTS / "long_tail.json").write_text(json.dumps({**recorded, "rows": rows}, indent=1))
        return report(rows, args)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from engines import quickstart_model

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = quickstart_model(work)
    rows = []
    for seed in args.seeds:
        for mode in args.modes:
            name = run_name(mode, seed)
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
    return report(rows, args)


def report(rows: list[dict], args) -> int:
    table = markdown(rows, args)
    (RESULTS / "long_tail.md").write_text(table)
    plot(rows, RESULTS / "long_tail.png")
    print("\n" + table + f"\nplot: {os.path.relpath(RESULTS / 'long_tail.png', REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
