"""The quickstart over several seeds in fp32 and in bf16 (forced, every stage): does bf16 learn as well?

    python benchmarks/precision.py                      # seeds 0-4, fp32 and bf16, two runs at a time
    python benchmarks/precision.py --seeds 0 1 --jobs 1 # fewer seeds, one run at a time
    python benchmarks/precision.py --report             # the table and plot from the runs already made
    python benchmarks/precision.py --precisions bf16 bf16-rollouts --seeds 0 1 2 --results precision_rollouts
                                                        # bf16 rollout weights too (explorer.rollout.dtype)
    python benchmarks/precision.py --workload w25m --precisions bf16 bf16-rollouts-is --seeds 0 \
        --share-sft --results precision_rollouts_w25m   # the same question on the 25M workload (W2), with
                                                        # the rollout correction bf16 rollouts now get; one
                                                        # SFT stage for both (~15 min), GRPO side by side
    python benchmarks/precision.py --redo-stage grpo    # rerun only the GRPO stage of the runs made, from
                                                        # their SFT checkpoints (after a GRPO recipe change)

Each run is `trivium run --config examples/quickstart/grpo_word_problems.yaml` (`--workload w25m`:
benchmarks/w25m_grpo.yaml, the 25M model, 400 SFT steps and 50 GRPO steps of 16 x 8) with `--set seed=S` and
`--set trainer.precision=P` (both stages), in its own process, under benchmarks/workdir/precision/. On a
CPU without bf16 instructions `bf16` runs with bf16's numerics through the matrix-product emulation of
`trivium/models/bf16.py` (the same results as a native bf16 CPU up to summation order, at about fp32's
speed); the results file says which. The learning numbers (greedy accuracy on the quickstart's test split,
of the SFT model and after 100 GRPO steps) do not depend on the machine's load, so `--jobs 2` runs two at a
time on one thread each; the wall times printed are then not a speed comparison (benchmarks/vs_trl.py is).

Writes benchmarks/results/precision.json, precision.md (per seed, mean and spread) and precision.png (the
eval-accuracy curves). Exits 1 unless every run gains >= --min-gain and the bf16 mean gain is within
--max-gap of the fp32 mean gain (issue 23's bar: 0.30 and 0.10).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKDIR = REPO / "benchmarks" / "workdir" / "precision"
RESULTS = REPO / "benchmarks" / "results"
KEY = "eval/test/accuracy"
# What each variant sets (every stage). bf16-rollouts-is: the bf16 trainer, bf16 rollout weights and the
# rollout correction, what trainer.precision, explorer.rollout.dtype and algorithm.rollout_is_cap unset pick on
# hardware that multiplies bf16 natively. "bf16" pins the rollout weights to the policy's dtype: since
# explorer.rollout.dtype's default became `auto`, an unpinned bf16 variant samples with bf16 weights too.
VARIANTS = {
    "fp32": ["trainer.precision=fp32"],
    "bf16": ["trainer.precision=bf16", "explorer.rollout.dtype=null"],
    # bf16 rollouts without the rollout correction (as measured before algorithm.rollout_is_cap unset turned
    # it on for them) and with it
    "bf16-rollouts": [
        "trainer.precision=bf16",
        "explorer.rollout.dtype=bfloat16",
        "stages.1.algorithm.rollout_is_cap=0",
    ],
    "bf16-rollouts-is": [
        "trainer.precision=bf16",
        "explorer.rollout.dtype=bfloat16",
        "stages.1.algorithm.rollout_is_cap=2",  # the GRPO stage (SFT has no rollouts to correct)
    ],
}


@dataclass(frozen=True)
class Workload:
    config: Path  # two stages, "sft" then "grpo"; its ``project`` is the workload's name
    sft_steps: int
    grpo_steps: int
    min_gain: float  # the bar every run must clear (chosen before the runs, not after)


WORKLOADS = {
    "quickstart": Workload(REPO / "examples" / "quickstart" / "grpo_word_problems.yaml", 800, 100, 0.30),
    # The 25M model (hidden 512, 8 layers) on the explained word problems, ~100-token answers (W2).
    "w25m": Workload(REPO / "benchmarks" / "w25m_grpo.yaml", 400, 50, 0.05),
}


def w25m_learn_data(work: Path) -> Path:
    """The w25m learning check's data, written once into ``work/w25m-learn-data``: the explained word
    problems with two or three steps (the engine benchmark's W2 data has three to five, on which the SFT
    model was right on 1 of 64 test problems and GRPO found almost nothing to reinforce), 20,000 SFT rows
    (with 4,000 the 400 SFT steps of 32 went over them three times, and the model recited its training
    rows, nll 0.04, while getting 24 of 44 sampled equations wrong) and 128 test problems."""
    from trivium.tasks.word_problems import write_word_problems

    data = work / "w25m-learn-data"
    if not (data / "test.jsonl").exists():
        write_word_problems(
            data, seed=0, n_train=2000, n_test=128, n_sft=20000, style="explained", steps=(2, 3)
        )
    return data


WORKLOAD = "quickstart"  # set by --workload


def run_dir(precision: str, seed: int) -> Path:
    return WORKDIR / WORKLOAD / f"{precision}-seed{seed}"


def log_path(precision: str, seed: int) -> Path:
    prefix = "" if WORKLOAD == "quickstart" else f"{WORKLOAD}-"  # the quickstart's logs keep their names
    return WORKDIR / f"{prefix}{precision}-seed{seed}.log"


def run_one(precision: str, seed: int, threads: int, config: Path | None = None) -> dict:
    out = run_dir(precision, seed)
    cmd = [
        "trivium", "run", "--config", str(config or WORKLOADS[WORKLOAD].config),
        "--set", f"seed={seed}",
        *[arg for setting in VARIANTS[precision] for arg in ("--set", setting)],
        "--set", f"name={out.name}",
        "--set", f"checkpoint_root={WORKDIR}",
        "--set", "monitor.progress_bar=false",
        "--set", f"runtime.num_threads={threads}",
    ]  # fmt: skip
    log = log_path(precision, seed)
    if config is not None:  # a stage alone (share_first_stage): a log of its own, the run's is the next
        log = log.with_name(f"{log.stem}{config.stem}.log")
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO).returncode
    print(
        f"{out.name}: rc {rc} in {time.perf_counter() - t0:.0f} s (log {log.relative_to(REPO)})", flush=True
    )
    return {"precision": precision, "seed": seed, "rc": rc, "seconds": time.perf_counter() - t0}


def read_run(precision: str, seed: int) -> dict | None:
    path = run_dir(precision, seed) / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    curve = [(r["stage"], r["global_step"], r[KEY]) for r in rows if KEY in r]
    sft = [a for stage, _, a in curve if stage == "sft"]
    rl = [a for stage, _, a in curve if stage != "sft"]
    last = WORKLOADS[WORKLOAD].grpo_steps
    if not sft or not rl or not any(r.get("stage") == "grpo" and r.get("step") == last for r in rows):
        return None  # unfinished
    log = log_path(precision, seed).read_text(errors="replace")
    chosen = next((line.split("trainer.trainer: ", 1)[1] for line in log.splitlines() if "precision" in line
                   and "trainer.trainer: " in line), "")  # fmt: skip
    return {
        "precision": precision,
        "seed": seed,
        "sft_accuracy": sft[-1],
        "final_accuracy": rl[-1],
        "gain": rl[-1] - sft[-1],
        "curve": curve,
        "seconds": rows[-1].get("time"),
        "trainer_precision": chosen,
    }


def share_first_stage(precisions: list[str], seed: int, threads: int, sft_seed: int | None = None) -> None:
    """Train the first stage (SFT) once, as ``precisions[0]`` with seed ``sft_seed`` (default ``seed``) on
    ``threads`` threads, and give every variant of ``seed`` a copy of that run folder cut after the first
    stage, so that each then runs only the second stage, from the same checkpoint. For variants whose first
    stage trains alike (bf16 and bf16-rollouts: rollout weights matter only where the run samples): the SFT
    model's accuracy is then the first variant's evaluation of it. With ``sft_seed`` other than ``seed`` the
    second stage samples and shuffles with ``seed`` from the ``sft_seed`` SFT model (more RL seeds for one
    SFT run)."""
    import yaml

    sft_seed = seed if sft_seed is None else sft_seed
    source, config = run_dir(precisions[0], sft_seed), WORKLOADS[WORKLOAD].config
    cfg = yaml.safe_load(config.read_text())
    stage, later = cfg["stages"][0]["name"], [st["name"] for st in cfg["stages"][1:]]
    if not (source / "checkpoints" / stage / f"step_{WORKLOADS[WORKLOAD].sft_steps}").is_dir():
        # A config of the first stage alone, beside the original (its relative paths stay right).
        only = config.with_name(f".{config.stem}.{stage}-only.yaml")
        only.write_text(yaml.safe_dump({**cfg, "stages": cfg["stages"][:1]}, sort_keys=False))
        try:
            done = run_one(precisions[0], sft_seed, threads, config=only)
        finally:
            only.unlink()
        if done["rc"] != 0:
            raise SystemExit(f"the shared {stage} stage of seed {sft_seed} failed: see its log")
    for precision in precisions:
        target = run_dir(precision, seed)
        if target == source or target.exists():
            continue
        shutil.copytree(source, target)
        for name in later:  # the source may have run them already
            redo_stage(precision, seed, name)
        print(f"{target.name}: {stage} stage copied from {source.name}", flush=True)


def redo_stage(precision: str, seed: int, stage: str) -> bool:
    """Forget ``stage`` of a finished run (its checkpoints, metrics records and trajectories), so that
    `trivium run` resumes the run from the previous stage's last checkpoint and runs ``stage`` as the config
    says now. Returns whether there was a run to redo."""
    out = run_dir(precision, seed)
    metrics = out / "metrics.jsonl"
    if not metrics.exists() or not (out / "checkpoints").is_dir():
        return False
    shutil.rmtree(out / "checkpoints" / stage, ignore_errors=True)
    kept = [x for x in metrics.read_text().splitlines() if x.strip() and json.loads(x).get("stage") != stage]
    metrics.write_text("".join(x + "\n" for x in kept))
    trajectories = out / "trajectories.jsonl"
    if trajectories.exists():
        rows = trajectories.read_text().splitlines()
        trajectories.write_text(
            "".join(x + "\n" for x in rows if x.strip() and json.loads(x).get("stage") != stage)
        )
    return True


def hardware() -> str:
    """Whether this machine multiplies bf16 natively (the runs' bf16 numbers are then native bf16's) or
    through the emulation, and its CPU (the report is read on another machine)."""
    import torch

    from trivium.models.bf16 import native_bf16

    native, why = native_bf16(torch.device("cpu"))
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    how = "native" if native else "emulated (trivium/models/bf16.py: bf16 numerics at fp32 speed)"
    return f"{how}: {why}; CPU {model}, {os.cpu_count()} cores"


def report(precisions: list[str], seeds: list[int], min_gain: float, max_gap: float, name: str) -> int:
    runs = [r for p in precisions for s in seeds if (r := read_run(p, s)) is not None]
    missing = [(p, s) for p in precisions for s in seeds if read_run(p, s) is None]
    lines = [
        "| precision | seed | SFT model | after GRPO | gain |",
        "| --- | --- | --- | --- | --- |",
    ]
    summary = {}
    for p in precisions:
        mine = [r for r in runs if r["precision"] == p]
        for r in mine:
            lines.append(
                f"| {p} | {r['seed']} | {r['sft_accuracy']:.3f} | {r['final_accuracy']:.3f} | {100 * r['gain']:+.1f} |"
            )
        if mine:
            gains = [r["gain"] for r in mine]
            summary[p] = {
                "mean_gain": statistics.mean(gains),
                "min_gain": min(gains),
                "max_gain": max(gains),
                "stdev_gain": statistics.stdev(gains) if len(gains) > 1 else 0.0,
                "mean_final": statistics.mean(r["final_accuracy"] for r in mine),
                "runs": len(mine),
            }
    lines += ["", "| precision | runs | mean gain | spread (min .. max) | stdev | mean final accuracy |",
              "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for p, s in summary.items():
        lines.append(
            f"| {p} | {s['runs']} | {100 * s['mean_gain']:+.1f} | {100 * s['min_gain']:+.1f} .. "
            f"{100 * s['max_gain']:+.1f} | {100 * s['stdev_gain']:.1f} | {s['mean_final']:.3f} |"
        )
    verdicts = []
    bad = [r for r in runs if r["gain"] < min_gain]
    verdicts.append(f"every run gains >= {100 * min_gain:+.0f} points: " + ("yes" if not bad else
                    "NO (" + ", ".join(f"{r['precision']} seed {r['seed']} {100 * r['gain']:+.1f}" for r in bad) + ")"))  # fmt: skip
    gaps = []
    pairs = (
        ("bf16", "fp32"),
        ("bf16-rollouts", "bf16"),
        ("bf16-rollouts-is", "bf16"),
        ("bf16-rollouts-is", "fp32"),
    )
    for variant, baseline in pairs:
        if variant in summary and baseline in summary:
            gap = summary[variant]["mean_gain"] - summary[baseline]["mean_gain"]
            gaps.append(gap)
            verdicts.append(
                f"{variant} mean gain - {baseline} mean gain = {100 * gap:+.1f} points "
                f"(bar: within {100 * max_gap:.0f})"
            )
    if missing:
        verdicts.append("missing or unfinished runs: " + ", ".join(f"{p} seed {s}" for p, s in missing))
    chosen = sorted({r["trainer_precision"] for r in runs if r["trainer_precision"]})
    verdicts.append(f"bf16 here: {hardware()}")
    text = "\n".join(lines + [""] + [f"- {v}" for v in verdicts] + [f"- trainer log: {c}" for c in chosen])
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.md").write_text(
        f"# The {WORKLOAD} workload in {', '.join(precisions)} over seeds (benchmarks/precision.py)\n\n"
        + text
        + "\n"
    )
    (RESULTS / f"{name}.json").write_text(json.dumps({"runs": runs, "summary": summary}, indent=1) + "\n")
    plot(runs, RESULTS / f"{name}.png")
    ok = not bad and not missing and all(abs(g) <= max_gap for g in gaps)
    return 0 if ok else 1


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {
        "fp32": "tab:blue",
        "bf16": "tab:orange",
        "bf16-rollouts": "tab:green",
        "bf16-rollouts-is": "tab:red",
    }
    for r in runs:
        xs = [step for _, step, _ in r["curve"]]
        ys = [acc for _, _, acc in r["curve"]]
        label = (
            r["precision"]
            if r["seed"] == min(x["seed"] for x in runs if x["precision"] == r["precision"])
            else None
        )
        ax.plot(xs, ys, color=colours.get(r["precision"], "grey"), alpha=0.7, marker=".", label=label)
    w = WORKLOADS[WORKLOAD]
    ax.set_xlabel(f"global step (SFT {w.sft_steps} steps, then GRPO {w.grpo_steps})")
    ax.set_ylabel("greedy accuracy on the test split")
    ax.set_title(f"{WORKLOAD}, one line per seed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="quickstart")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=sorted(VARIANTS))
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (each gets cores/jobs threads)")
    ap.add_argument("--report", action="store_true", help="only read the runs already made")
    ap.add_argument(
        "--redo-stage",
        metavar="STAGE",
        help="rerun this stage of the runs already made, resuming each from its previous stage's checkpoint",
    )
    ap.add_argument(
        "--results",
        default="precision",
        help="name of the results files (benchmarks/results/NAME.md/.json/.png)",
    )
    ap.add_argument(
        "--share-sft",
        action="store_true",
        help="train each seed's SFT stage once (the first precision's, on every core) and start each "
        "variant's GRPO stage from it: for variants whose SFT trains alike (bf16, bf16-rollouts)",
    )
    ap.add_argument(
        "--sft-seed",
        type=int,
        help="with --share-sft: every seed's GRPO stage starts from this seed's SFT model (run once)",
    )
    ap.add_argument("--min-gain", type=float, help="default: the workload's bar (quickstart 0.30, w25m 0.05)")
    ap.add_argument("--max-gap", type=float, default=0.10)
    args = ap.parse_args()
    global WORKLOAD
    WORKLOAD = args.workload
    min_gain = WORKLOADS[WORKLOAD].min_gain if args.min_gain is None else args.min_gain
    if WORKLOAD == "w25m":
        w25m_learn_data(WORKDIR.parent)  # the config reads workdir/w25m-learn-data
    if not args.report:
        WORKDIR.mkdir(parents=True, exist_ok=True)
        if args.redo_stage:
            for p in args.precisions:
                for s in args.seeds:
                    if redo_stage(p, s, args.redo_stage):
                        print(f"{p}-seed{s}: stage {args.redo_stage} forgotten, to be run again", flush=True)
        todo = [(p, s) for s in args.seeds for p in args.precisions if read_run(p, s) is None]
        if args.share_sft:
            for s in sorted({s for _, s in todo}):
                share_first_stage(args.precisions, s, os.cpu_count() or 1, args.sft_seed)
        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        with ThreadPoolExecutor(args.jobs) as pool:
            for done in pool.map(lambda ps: run_one(*ps, threads), todo):
                if done["rc"] != 0:
                    print(f"run {done} failed: see its log", file=sys.stderr)
    return report(args.precisions, args.seeds, min_gain, args.max_gap, args.results)


if __name__ == "__main__":
    sys.exit(main())
