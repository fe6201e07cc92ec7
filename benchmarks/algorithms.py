"""Learning benchmark: every algorithm from the same SFT checkpoint on the quickstart task, fixed budget.

    python benchmarks/algorithms.py                          # ~20 min on 2 CPU cores
    python benchmarks/algorithms.py --only grpo,rloo --steps 40

Needs the quickstart's run folder (runs/quickstart/word-problems; run the quickstart first, or pass
--run-dir): its SFT checkpoint is every algorithm's start, and its final GRPO checkpoint (a stronger
model of the same tokenizer) is the teacher of the distillation algorithms. Offline algorithms train from
the same start: DPO on pairs made from the task (the gold solution chosen, the confused teacher's wrong
one rejected) and SFT on correct demonstrations. Each run is a separate `trivium run`; accuracy is greedy
on the 256 held-out problems. Prints a Markdown table and writes it, with JSON, to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "quickstart" / "data"
OFFLINE = ("dpo", "sft")


def rl_algorithms() -> list[str]:
    from trivium.algorithm.presets import PRESETS

    return sorted(name for name, p in PRESETS.items() if p.needs_rollouts)


def base_config(name: str, model: Path, work: Path, steps: int) -> dict:
    return {
        "project": "algorithms",
        "name": name,
        "checkpoint_root": str(work),
        "seed": 0,
        "model": {"path": str(model)},
        "explorer": {"rollout": {"max_tokens": 24}, "eval_interval": 0, "eval_at_start": False},
        "buffer": {
            "batch_size": 16,
            "total_steps": steps,
            "eval_tasksets": [{"path": str(DATA / "test.jsonl"), "name": "test"}],
        },
        "trainer": {"lr": 2e-4, "micro_batch_size": 128},
        "monitor": {"progress_bar": False},
    }


def rl_config(algorithm: str, model: Path, teacher: Path, work: Path, steps: int) -> dict:
    from trivium.algorithm.presets import PRESETS

    cfg = base_config(algorithm, model, work, steps)
    cfg["algorithm"] = {"algorithm_type": algorithm}
    cfg["buffer"]["taskset"] = {"path": str(DATA / "train.jsonl"), "repeat_times": 8}
    preset = PRESETS[algorithm]
    if preset.needs_teacher:
        cfg["auxiliary_models"] = [{"name": "teacher", "path": str(teacher)}]
    if preset.sample_strategy == "mix":  # CHORD: 20% of the batch are correct demonstrations
        cfg["buffer"]["expert_dataset"] = {
            "path": str(DATA / "train.jsonl"),
            "fields": {"prompt": "question", "response": "answer"},
        }
        cfg["buffer"]["expert_per_step"] = 32
    return cfg


def offline_config(algorithm: str, model: Path, work: Path, steps: int, pairs: Path) -> dict:
    cfg = base_config(algorithm, model, work, steps)
    cfg.update(mode="train", algorithm={"algorithm_type": algorithm})
    cfg["buffer"]["batch_size"] = 32
    if algorithm == "dpo":
        cfg["buffer"]["preference_dataset"] = {"path": str(pairs)}
        cfg["trainer"]["lr"] = 1e-4
    else:  # SFT on correct demonstrations (the gold solutions of the RL task set)
        cfg["buffer"]["sft_dataset"] = {
            "path": str(DATA / "train.jsonl"),
            "fields": {"prompt": "question", "response": "answer"},
        }
        cfg["trainer"]["lr"] = 3e-4
    return cfg


def preference_pairs(path: Path, n: int = 4000, seed: int = 7) -> Path:
    """Gold solution (chosen) vs the confused teacher's wrong solution (rejected) of the same problem."""
    from trivium.tasks.word_problems import generate_rows

    gold = generate_rows(n, seed=seed)
    noisy = generate_rows(n, seed=seed, noisy=True)
    rows = [
        {"prompt": g["question"], "chosen": g["answer"], "rejected": b["answer"]}
        for g, b in zip(gold, noisy)
        if g["question"] == b["question"] and g["answer"] != b["answer"]
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(cfg: dict, work: Path) -> tuple[float, float]:
    path = work / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - t0
    rows = [
        json.loads(x) for x in (work / "algorithms" / cfg["name"] / "metrics.jsonl").read_text().splitlines()
    ]
    return [r["eval/test/accuracy"] for r in rows if "eval/test/accuracy" in r][-1], seconds


def start_accuracy(run_dir: Path) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["eval/test/accuracy"] for r in rows if r["stage"] == "sft" and "eval/test/accuracy" in r][-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default=str(REPO / "runs" / "quickstart" / "word-problems"))
    ap.add_argument("--steps", type=int, default=60, help="train steps per algorithm")
    ap.add_argument("--only", default="", help="comma-separated algorithms (default: all)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    run_dir = Path(args.run_dir)
    ckpts = run_dir / "checkpoints"
    sft_model = max((ckpts / "sft").glob("step_*"), key=lambda p: int(p.name[5:])) / "model"
    teacher = max((ckpts / "grpo").glob("step_*"), key=lambda p: int(p.name[5:])) / "model"
    start = start_accuracy(run_dir)
    work = Path(tempfile.mkdtemp(prefix="trivium-algos-"))
    names = [*rl_algorithms(), *OFFLINE]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    pairs = preference_pairs(work / "pairs.jsonl")
    results = []
    print(f"start (SFT checkpoint) accuracy {start:.3f}; teacher {teacher}", flush=True)
    for name in names:
        cfg = (
            offline_config(name, sft_model, work, args.steps, pairs)
            if name in OFFLINE
            else rl_config(name, sft_model, teacher, work, args.steps)
        )
        end, seconds = run(cfg, work)
        results.append({"algorithm": name, "start": start, "end": end, "seconds": round(seconds, 1)})
        print(f"{name:28s} {start:.3f} -> {end:.3f}  ({seconds:.0f} s)", flush=True)
    table = ["| algorithm | start acc | end acc | change | seconds |", "|---|---|---|---|---|"]
    table += [
        f"| {r['algorithm']} | {r['start']:.3f} | {r['end']:.3f} | {r['end'] - r['start']:+.3f} | "
        f"{r['seconds']:.0f} |"
        for r in results
    ]
    print("\n" + "\n".join(table))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "algorithms.md").write_text(
        f"{args.steps} train steps per algorithm from the quickstart's SFT checkpoint (2 CPU cores).\n\n"
        + "\n".join(table)
        + "\n"
    )
    (out / "algorithms.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
