"""Task selection on the quickstart's GRPO stage: ``buffer.selector: online_difficulty`` against ``random``,
from the same SFT checkpoint, same seed and steps.

    python benchmarks/selection.py              # the quickstart's 800 SFT steps once, then a pair of 100 steps
    python benchmarks/selection.py --steps 60 --seeds 0 1

The recorded results (``benchmarks/results/selection_*.md``) start from ``--model``: the checkpoint of the
quickstart's SFT stage stopped by SIGTERM at step 92 of 800 (this machine was too busy for the whole
stage), e.g. ``--model <work>/bench-selection/sft/checkpoints/sft/step_92/model --steps 40 --eval-every 10
[--max-rows 128] [--selectors online_difficulty --selector-args '{"pooled_prior": true}'] --tag _all``.

The SFT checkpoint is the quickstart's SFT stage, trained once into ``--work`` (default
``benchmarks/workdir``, ~4 min) and reused. Both runs of a pair use the quickstart's GRPO stage (16 tasks x
8 samples, 24 tokens, lr 2e-4), greedy evaluation on the 256 held-out problems every ``--eval-every``
steps, and differ only in ``buffer.selector``. Reported per run: the fraction of groups with non-zero reward
variance (the groups GRPO learns from: an all-equal group has zero advantage), the mean training reward,
and the greedy accuracy curve. Writes ``benchmarks/results/selection.json`` and ``selection.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"
DATA = REPO / "examples" / "quickstart" / "data"
sys.path.insert(0, str(REPO / "benchmarks"))
import quickstart_grpo  # noqa: E402
from quickstart_grpo import grpo_shape  # noqa: E402


def _absolute(cfg: dict) -> dict:
    """The quickstart's data paths made absolute (the YAML is written elsewhere)."""
    cfg["model"]["tiny"]["corpus"] = [str(DATA.parent / p) for p in cfg["model"]["tiny"]["corpus"]]
    cfg["buffer"]["eval_tasksets"] = [{"path": str(DATA / "test.jsonl"), "name": "test"}]
    return cfg


def sft_model(work: Path, steps: int) -> Path:
    """The quickstart's SFT stage (``steps`` steps, its cosine schedule over them), run once into ``work``."""
    cfg = _absolute(yaml.safe_load(QUICKSTART.read_text()))
    sft = cfg["stages"][0]
    sft["buffer"]["total_steps"] = steps
    sft["trainer"]["warmup_steps"] = min(sft["trainer"]["warmup_steps"], steps // 10)
    done = work / "bench-selection" / f"sft-{steps}" / "checkpoints" / "sft" / f"step_{steps}" / "model"
    if (done / "model.safetensors").exists():
        return done
    sft["buffer"]["sft_dataset"]["path"] = str(DATA / "sft.jsonl")
    cfg.update(
        project="bench-selection",
        name=f"sft-{steps}",
        checkpoint_root=str(work),
        monitor={"progress_bar": False},
    )
    cfg["stages"] = [sft]
    path = work / "selection-sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"], check=True)
    return done


def grpo_config(model: Path, work: Path, name: str, seed: int, selector: str, args) -> Path:
    cfg, grpo = quickstart_grpo.grpo_config(
        model, work, project="bench-selection", name=name, seed=seed, threads=args.threads, steps=args.steps
    )
    cfg["explorer"]["eval_interval"] = args.eval_every
    grpo["buffer"]["selector"] = selector
    if selector == "online_difficulty" and args.selector_args:
        grpo["buffer"]["selector_args"] = json.loads(args.selector_args)
    if args.max_rows:
        grpo["buffer"]["taskset"]["max_rows"] = args.max_rows
    return quickstart_grpo.write(cfg, work)


def start(path: Path) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"]
    with open(path.with_suffix(".log"), "w") as log:  # a file, not a pipe: runs side by side never block
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), time.perf_counter()


def collect(proc: subprocess.Popen, t0: float, path: Path, folder: Path) -> dict:
    if proc.wait() != 0:
        raise RuntimeError(f"{path.name} failed:\n{path.with_suffix('.log').read_text()[-3000:]}")
    records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "rollout/tasks" in r]
    evals = [(r["step"], r["eval/test/accuracy"]) for r in records if "eval/test/accuracy" in r]
    informative = sum(r.get("rollout/informative_groups", 0.0) for r in steps)
    groups = sum(r.get("rollout/groups", 0.0) for r in steps)
    return {
        "steps": len(steps),
        "informative_fraction": informative / max(groups, 1.0),
        "informative_per_step": [r.get("rollout/informative_groups", 0.0) for r in steps],
        "reward_mean": sum(r["rollout/reward_mean"] for r in steps) / max(len(steps), 1),
        "curve": evals,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--work", default=str(REPO / "benchmarks" / "workdir"), help="SFT model and runs (reused)"
    )
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps (the quickstart's: 100)")
    ap.add_argument("--sft-steps", type=int, default=800, help="SFT steps (the quickstart's: 800)")
    ap.add_argument("--eval-every", type=int, default=20, help="greedy evaluation interval in steps")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--selectors", nargs="+", default=["random", "online_difficulty"])
    ap.add_argument(
        "--threads", type=int, default=1, help="runtime.num_threads (1: fair on a shared machine)"
    )
    ap.add_argument("--sft-only", action="store_true", help="only train (or find) the SFT checkpoint")
    ap.add_argument("--max-rows", type=int, default=0, help="train on the first N tasks only (0: all 4,000)")
    ap.add_argument("--selector-args", default="", help="JSON buffer.selector_args of online_difficulty")
    ap.add_argument("--tag", default="", help="suffix of the results files and run names")
    ap.add_argument("--model", default="", help="start GRPO from this model folder instead of the SFT run")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = Path(args.model).resolve() if args.model else sft_model(work, args.sft_steps)
    if args.sft_only:
        print(model)
        return 0
    rows = []
    for seed in args.seeds:  # the runs of one seed side by side (same load on each), one thread each
        running = []
        for selector in args.selectors:
            name = f"{selector}-s{seed}{args.tag}"
            path = grpo_config(model, work, name, seed, selector, args)
            running.append((selector, path, name, *start(path)))
        for selector, path, name, proc, t0 in running:
            row = collect(proc, t0, path, work / "bench-selection" / name)
            row.update(selector=selector, seed=seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    recorded = {
        **vars(args),
        "work": os.path.relpath(args.work, REPO),
        "model": os.path.relpath(model, REPO),
    }  # no machine paths in results
    (RESULTS / f"selection{args.tag}.json").write_text(json.dumps({"args": recorded, "rows": rows}, indent=1))
    table = markdown(rows, args)
    (RESULTS / f"selection{args.tag}.md").write_text(table)
    print("\n" + table)
    return 0


def model_note(args) -> str:
    if args.model:
        return f"the model {os.path.relpath(Path(args.model).resolve(), REPO)}"
    return f"the quickstart's SFT stage cut to {args.sft_steps} steps"


def markdown(rows: list[dict], args) -> str:
    tasks, group = grpo_shape()
    steps = sorted({s for r in rows for s, _ in r["curve"]})
    lines = [
        f"# benchmarks/selection.py ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {args.steps} GRPO "
        f"steps of {tasks} tasks x {group} samples, {args.max_rows or 'all'} train tasks, from {model_note(args)})",
        "",
        "| selector | seed | groups with reward variance | mean train reward | "
        + " | ".join(f"acc@{s}" for s in steps)
        + " | wall s |",
        "|---|---|---|---|" + "---|" * len(steps) + "---|",
    ]
    for r in rows:
        curve = dict(r["curve"])
        accs = " | ".join(f"{curve[s]:.3f}" if s in curve else "" for s in steps)
        lines.append(
            f"| {r['selector']} | {r['seed']} | {r['informative_fraction']:.3f} | {r['reward_mean']:.3f} | "
            f"{accs} | {r['wall_s']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
