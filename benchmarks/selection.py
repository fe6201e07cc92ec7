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
from curves import plot_variants  # noqa: E402
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


def spread_taskset(work: Path, per_kind: int) -> Path:
    """A task set with a wide difficulty spread, ``per_kind`` tasks of each kind interleaved, from the
    quickstart's train split (deterministic): *easy* (one step with a verb the teacher confuses 5% of the
    time), *hard* (every verb confused 60-75% of the time: the errors GRPO fixes on held-out problems) and
    *mislabelled* (other problems whose label is wrong: the final number + 13, which no answer matches, as
    mislabelled rows in real data). Sampled 8 times each by the quickstart's SFT model, their mean pass
    rates are 0.76, 0.20 and 0.01 (docs/recipes.md), and a task comes back about 10 times in 60 steps: the
    case a selector that learns each task's pass rate is for."""
    from trivium.tasks.word_problems import VERBS

    def confusions(question: str) -> list[float]:
        return [v.confusion for v in VERBS if v.phrase.split(" {n}")[0] in question]

    kinds: dict[str, list[dict]] = {"easy": [], "hard": [], "mislabelled": []}
    for line in (DATA / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        c = confusions(row["question"])
        if len(c) == 1 and c[0] <= 0.05:
            kind = "easy"
        elif c and min(c) >= 0.6:
            kind = "hard"
        else:
            kind = "mislabelled"
            body, final = row["answer"].rsplit("#### ", 1)
            row = {**row, "answer": f"{body}#### {int(final) + 13}"}
        if len(kinds[kind]) < per_kind:
            kinds[kind].append(row)
    rows = [row for k in range(per_kind) for kind in kinds.values() for row in kind[k : k + 1]]
    path = work / f"selection-spread-{per_kind}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


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
    if args.spread:
        grpo["buffer"]["taskset"]["path"] = str(spread_taskset(work, args.spread))
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
    ap.add_argument(
        "--spread",
        type=int,
        default=0,
        help="train on N easy + N hard + N mislabelled tasks (spread_taskset); 0: the train split",
    )
    ap.add_argument(
        "--plot-results",
        nargs="+",
        default=None,
        metavar="JSON",
        help="no runs: plot these recorded results together (one variant per selector and selector_args) "
        "into docs/selection<tag>.png",
    )
    args = ap.parse_args()
    if args.plot_results:
        return plot_results([Path(p) for p in args.plot_results], args.tag)
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
    if len(args.seeds) > 1:  # curves over seeds, as docs/recipes.md shows them
        title = short_title(args)
        out = REPO / "docs" / f"selection{args.tag}.png"
        plot_variants(rows, args.selectors, "selector", "greedy eval/test/accuracy", title, out)
    print("\n" + table)
    return 0


def train_note(args) -> str:
    if args.spread:
        return f"{3 * args.spread} train tasks of three kinds (easy / hard / mislabelled, spread_taskset)"
    return f"{args.max_rows or 'all'} train tasks"


def plot_results(paths: list[Path], tag: str) -> int:
    """Curves of several recorded ``selection*.json`` on one plot, each selector named with its arguments."""
    rows, names = [], []
    for path in paths:
        recorded = json.loads(path.read_text())
        extra = recorded["args"].get("selector_args") or ""
        for row in recorded["rows"]:
            name = row["selector"] + (f" {extra}" if extra and row["selector"] == "online_difficulty" else "")
            rows.append({**row, "variant": name})
            names += [name] if name not in names else []
    args = argparse.Namespace(**recorded["args"])
    title = short_title(args)
    out = REPO / "docs" / f"selection{tag}.png"
    plot_variants(rows, names, "variant", "greedy eval/test/accuracy", title, out)
    print(out)
    return 0


def short_title(args) -> str:
    what = f"--spread {args.spread}: {3 * args.spread} tasks" if args.spread else train_note(args)
    return f"benchmarks/selection.py {what}, {args.steps} steps"


def model_note(args) -> str:
    if args.model:
        return f"the model {os.path.relpath(Path(args.model).resolve(), REPO)}"
    return f"the quickstart's SFT stage cut to {args.sft_steps} steps"


def markdown(rows: list[dict], args) -> str:
    tasks, group = grpo_shape()
    steps = sorted({s for r in rows for s, _ in r["curve"]})
    lines = [
        f"# benchmarks/selection.py ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, {args.steps} GRPO "
        f"steps of {tasks} tasks x {group} samples, {train_note(args)}, from {model_note(args)})",
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
