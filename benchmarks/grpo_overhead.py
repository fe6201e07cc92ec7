"""Trivium's GRPO step vs a plain PyTorch loop on the same workload, measured side by side in one run.

    python benchmarks/grpo_overhead.py                # ~6 min on 2 CPU cores (includes the SFT warm-up)
    python benchmarks/grpo_overhead.py --model DIR    # reuse an SFT checkpoint

The workload is the quickstart's GRPO stage (16 prompts x 8 samples, 24 new tokens, lr 2e-4, PPO-clip,
token-mean, one update per batch) from the same SFT checkpoint. Each side runs in its own process,
alternating (reference, trivium) pairs ``--repeats`` times; the first step of each run is dropped.
Prints seconds per step for both and the ratio trivium / reference (target: <= 1.15).
"""

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
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"
DATA = REPO / "examples" / "quickstart" / "data"


def sft_checkpoint(work: Path) -> Path:
    cfg = yaml.safe_load(QUICKSTART.read_text())
    cfg.update(project="bench", name="sft", checkpoint_root=str(work), monitor={"progress_bar": False})
    cfg["stages"] = [cfg["stages"][0]]
    path = work / "sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _fix_paths(path)
    subprocess.run([sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"], check=True)
    steps = cfg["stages"][0]["buffer"]["total_steps"]
    return work / "bench" / "sft" / "checkpoints" / "sft" / f"step_{steps}" / "model"


def _fix_paths(path: Path) -> None:
    """Point the quickstart's relative data paths at the repo (the YAML now lives elsewhere)."""
    text = path.read_text().replace("data/", str(DATA) + "/")
    path.write_text(text)


def run_trivium(model: Path, steps: int, work: Path, tag: str) -> list[float]:
    cfg = yaml.safe_load(QUICKSTART.read_text())
    grpo = cfg["stages"][1]
    cfg.update(
        project="bench", name=f"grpo-{tag}", checkpoint_root=str(work), monitor={"progress_bar": False}
    )
    cfg["model"] = {"path": str(model)}
    cfg["buffer"]["eval_tasksets"] = []
    grpo["buffer"]["total_steps"] = steps
    grpo["buffer"]["taskset"]["shuffle"] = False
    cfg["stages"] = [grpo]
    path = work / f"grpo-{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    _fix_paths(path)
    subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows = [
        json.loads(x) for x in (work / "bench" / f"grpo-{tag}" / "metrics.jsonl").read_text().splitlines()
    ]
    times = [r["time"] for r in rows]
    return [b - a for a, b in itertools.pairwise(times)]  # wall time between step records; drops step 1


def run_reference(model: Path, steps: int) -> list[float]:
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "reference_grpo.py"),
            str(model),
            str(DATA / "train.jsonl"),
            "--steps",
            str(steps),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [json.loads(x)["step_s"] for x in out.splitlines() if x.startswith("{")][1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="SFT checkpoint folder (default: run the quickstart's SFT stage first)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trivium-bench-"))
    model = Path(args.model) if args.model else sft_checkpoint(work)
    pairs = []
    for r in range(args.repeats):
        ref = run_reference(model, args.steps)
        tri = run_trivium(model, args.steps, work, str(r))
        pairs.append((ref, tri))
        print(
            f"pair {r + 1}: reference {statistics.median(ref):.3f} s/step, trivium {statistics.median(tri):.3f} "
            f"s/step, ratio {statistics.median(tri) / statistics.median(ref):.2f}x",
            flush=True,
        )
    ref_all = [x for ref, _ in pairs for x in ref]
    tri_all = [x for _, tri in pairs for x in tri]
    print("\n| loop | median s/step | mean s/step |\n|---|---|---|")
    for name, xs in (
        ("plain PyTorch + HF generate", ref_all),
        ("trivium run (quickstart GRPO stage)", tri_all),
    ):
        print(f"| {name} | {statistics.median(xs):.3f} | {statistics.mean(xs):.3f} |")
    ratio = statistics.median(tri_all) / statistics.median(ref_all)
    print(f"\ntrivium / reference (median): {ratio:.2f}x  (target <= 1.15x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
