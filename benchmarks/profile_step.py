"""Where one GRPO step's time goes: the quickstart's GRPO stage, its per-phase ``time/*`` metrics as a table.

    python benchmarks/profile_step.py --model runs/quickstart/word-problems/checkpoints/sft/step_800/model
    python benchmarks/profile_step.py                  # runs the quickstart's SFT stage first (~4 min)
    python benchmarks/profile_step.py --steps 20 --set trainer.precision=bf16 --set explorer.rollout.dtype=bfloat16

The workload is the quickstart's GRPO stage (16 prompts x 8 samples, 24 new tokens, lr 2e-4, greedy eval
of 256 problems every 10 steps) from an SFT checkpoint. The first step is dropped (warm-up). For each
phase (``src/trivium/monitor/phases.py``): median seconds per step, its share of the median step, and the
process's peak RSS while it ran (the largest over the steps; ``monitor.phase_memory`` is on), then the
run's peak RSS. ``--set KEY=VALUE`` passes config overrides to ``trivium run`` (e.g. the precision).

Not named ``profile.py``: a script's folder comes first on ``sys.path``, and a ``profile.py`` there
shadows the standard library's ``profile`` module (which ``cProfile`` imports) for every benchmark in it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from grpo_overhead import QUICKSTART, _fix_paths, sft_checkpoint  # noqa: E402

# (phase, what it holds); rows in this order, nested ones indented
PHASES = [
    ("rollout", "explore step: sampling, rewards, workflows"),
    ("  rollout_generate", "in the rollout engine"),
    ("  rollout_reward", "outside it: reward functions, workflow code"),
    ("train", "the trainer's step"),
    ("  collate", "experiences to padded tensors"),
    ("  old_logprobs", "a no-grad pass (skipped when on-policy)"),
    ("  ref_logprobs", "the KL reference's pass"),
    ("  advantages", "group advantages"),
    ("  forward_backward", "the training passes"),
    ("  optimizer", "clip + AdamW"),
    ("sync", "weights to the rollout engine"),
    ("eval", "greedy eval (its steps only, spread over all)"),
    ("idle", "waits, metrics and bookkeeping"),
]


def run_grpo(model: Path, steps: int, work: Path, overrides: list[str]) -> Path:
    cfg = yaml.safe_load(QUICKSTART.read_text())
    grpo = cfg["stages"][1]
    monitor = {"progress_bar": False, "phase_memory": True}
    cfg.update(project="bench", name="profile", checkpoint_root=str(work), monitor=monitor)
    cfg["model"] = {"path": str(model)}
    grpo["buffer"]["total_steps"] = steps
    grpo.setdefault("explorer", {})["eval_at_start"] = False
    cfg["stages"] = [grpo]
    path = work / "profile.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _fix_paths(path)
    sets = [x for kv in overrides for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite", *sets]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return work / "bench" / "profile"


def table(records: list[dict]) -> str:
    steps = [r for r in records if "time/step" in r][1:]  # the first step warms up
    if not steps:
        raise SystemExit("no step records with time/step: is this trivium version profiling its steps?")
    total = statistics.median(r["time/step"] for r in steps)
    lines = [
        f"{len(steps)} steps (first dropped), median {total:.3f} s/step; {sum('time/eval' in r for r in steps)} "
        "of them evaluate (eval: the mean over all steps)",
        "",
        "| phase | median s/step | share of the step | peak RSS MB | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, what in PHASES:
        key = "time/" + name.strip()
        values = [r.get(key, 0.0) for r in steps]
        if not any(values):
            continue
        mean = statistics.mean(values) if key == "time/eval" else statistics.median(values)
        label = name.replace("  ", "&nbsp;&nbsp;")
        peaks = [r["rss/" + name.strip()] for r in steps if "rss/" + name.strip() in r]
        peak = f"{max(peaks):.0f}" if peaks else "-"
        lines.append(f"| {label} | {mean:.3f} | {mean / total:.0%} | {peak} | {what} |")
    rss = max(r.get("train/peak_rss_mb", 0.0) for r in steps)
    tok = statistics.median(r.get("rollout/tokens_per_s", 0.0) for r in steps)
    lines += ["", f"peak RSS {rss:.0f} MB; rollout {tok:.0f} generated tokens/s"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="SFT checkpoint folder (default: run the quickstart's SFT stage first)")
    ap.add_argument("--steps", type=int, default=11)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--run-dir", help="print the table of an existing run folder instead of running")
    args = ap.parse_args()
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        work = Path(tempfile.mkdtemp(prefix="trivium-profile-"))
        model = Path(args.model) if args.model else sft_checkpoint(work)
        run_dir = run_grpo(model, args.steps, work, args.overrides)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
