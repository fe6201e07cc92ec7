"""Learning benchmark for the agentic workflows: a tool-using calculator agent and a FrozenLake agent.

    python benchmarks/agents.py                      # both tasks (data, SFT warm-up, GRPO, eval)
    python benchmarks/agents.py --tasks frozenlake   # one task
    python benchmarks/agents.py --grpo-steps 10      # a shorter run

For each task it writes the example data (examples/agents/make_data.py), runs
``trivium run --config examples/agents/<task>.yaml`` (a tiny model made from the data, SFT on a confused
teacher's demonstrations, then GRPO through the multi-turn workflow), and prints the greedy success rate
on the held-out test set at the end of SFT (start) and at the end of GRPO (end), with the curve. Results go
to benchmarks/results/agents_last_run.md (the README's figures and their records are in agents.md) and the
curves to docs/agents_<task>.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"calculator": "eval/test/accuracy", "frozenlake": "eval/test/success"}


def run_task(task: str, grpo_steps: int | None, sft_steps: int | None) -> dict:
    config = ROOT / "examples" / "agents" / f"{task}.yaml"
    cmd = [sys.executable, "-m", "trivium.cli", "run", "--config", str(config), "--overwrite"]
    if grpo_steps:
        cmd += ["--set", f"stages.1.buffer.total_steps={grpo_steps}"]
    if sft_steps:
        cmd += ["--set", f"stages.0.buffer.total_steps={sft_steps}"]
    t0 = time.perf_counter()
    log = ROOT / "runs" / "agents" / f"{task}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=out, stderr=subprocess.STDOUT, env=os.environ)
    seconds = time.perf_counter() - t0
    run_dir = ROOT / "runs" / "agents" / task
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    key = KEYS[task]
    curve = [(r["stage"], r["global_step"], r[key]) for r in rows if key in r]
    sft = [v for stage, _, v in curve if stage == "sft"]
    rl = [(step, v) for stage, step, v in curve if stage != "sft"]
    turns = [r["rollout/turns"] for r in rows if "rollout/turns" in r]
    from trivium.monitor.plot import plot_run

    plot = plot_run(run_dir, ROOT / "docs" / f"agents_{task}.png")
    return {
        "task": task,
        "metric": key,
        "start": sft[-1] if sft else None,
        "end": rl[-1][1] if rl else None,
        "curve": rl,
        "turns_first": turns[0] if turns else None,
        "turns_last": turns[-1] if turns else None,
        "seconds": seconds,
        "plot": str(plot.relative_to(ROOT)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["calculator", "frozenlake"], choices=sorted(KEYS))
    ap.add_argument("--grpo-steps", type=int, default=None, help="override the configs' GRPO steps")
    ap.add_argument("--sft-steps", type=int, default=None, help="override the configs' SFT steps")
    args = ap.parse_args()
    subprocess.run([sys.executable, str(ROOT / "examples" / "agents" / "make_data.py")], check=True)
    results = [run_task(t, args.grpo_steps, args.sft_steps) for t in args.tasks]
    lines = [
        "| task | metric (greedy, held-out) | after SFT | after GRPO | gain | turns/episode (first -> last step) | wall time |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        print(f"\n{r['task']}: {r['metric']}")
        for step, v in r["curve"]:
            print(f"  GRPO global step {step:4d}: {v:.3f}")
        gain = (r["end"] - r["start"]) if r["start"] is not None and r["end"] is not None else float("nan")
        print(f"  start (after SFT) {r['start']:.3f} -> end (after GRPO) {r['end']:.3f}: gain {gain:+.3f}")
        lines.append(
            f"| {r['task']} | {r['metric']} | {r['start']:.3f} | {r['end']:.3f} | {gain:+.3f} | "
            f"{r['turns_first']:.2f} -> {r['turns_last']:.2f} | {r['seconds']:.0f} s |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    out = ROOT / "benchmarks" / "results" / "agents_last_run.md"
    out.write_text(
        "# Agent learning benchmark\n\n`python benchmarks/agents.py` on 2 CPU cores (fp32).\n\n"
        + table
        + "\n"
    )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
