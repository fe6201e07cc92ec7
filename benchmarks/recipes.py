"""Research recipes against plain GRPO: same start, same task, same seeds (docs/recipes.md).

    python benchmarks/recipes.py stale                 # M2PO vs truncated IS vs none, explorer 3 steps ahead
    python benchmarks/recipes.py gigpo                 # GiGPO vs step-wise GRPO on FrozenLake, a move a turn
    python benchmarks/recipes.py r3l                   # reflect-and-retry vs step-wise GRPO on FrozenLake
    python benchmarks/recipes.py ask                   # Learn-to-Ask from logs vs online GRPO with a user
    python benchmarks/recipes.py stale --seeds 0 --steps 20   # shorter

``stale``: the quickstart's GRPO stage (32 tasks x 8 samples a step, 100 steps) from its SFT checkpoint,
with the explorer ``--offset`` steps ahead of the trainer (``synchronizer.sync_offset``): each batch was
sampled by weights up to that many updates old. The variants differ only in how the trainer treats that:
``grpo`` (PPO's ratio against the trainer's own old log-probs: staleness ignored), ``grpo+tis`` (the
truncated importance weight min(π_old/π_rollout, 2) on the advantages, ``algorithm.rollout_is_cap``),
``m2po`` (the ``m2po`` preset); ``on-policy`` (GRPO with no offset) is the reference.

``gigpo``: the FrozenLake agent example (``examples/agents/frozenlake.yaml``: random 4x4 maps, a confused
teacher's SFT, then 40 GRPO steps of 16 maps x 8 episodes) from its SFT checkpoint, its GRPO stage with the
``step_wise`` workflow (one experience per move, returns discounted by ``--discount``); the variants differ
only in the advantage: ``step_wise_grpo`` or ``gigpo``.

``r3l``: the same FrozenLake stage; ``step_wise_grpo`` against the ``reflect_retry`` workflow (failed episodes
diagnosed by the environment and retried from the mistaken move, ``--candidates`` samples of that move,
pivotal credit), with the positive advantages as they are (``retry``) and doubled (``r3l``:
``advantage_args: {positive_scale: 2}``). Evaluation plays the held-out maps with ``multi_turn``: no retries.

``ask``: Learn-to-Ask from a noisy expert's logged dialogues against online GRPO with a simulated user, both
from an SFT model of the logs (``recipe_ask.py``).

The SFT checkpoints are trained once into ``--work`` (default ``benchmarks/workdir``) and reused; ``--model``
starts from another. The runs of one seed go side by side, one thread each (their wall times are not a
speed comparison). Writes ``benchmarks/results/recipes_<recipe>.json`` and ``.md`` (each variant's greedy
held-out score, mean ± sample std over the seeds) and the curves ``docs/recipes_<recipe>.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
AGENTS = REPO / "examples" / "agents"
sys.path.insert(0, str(REPO / "benchmarks"))
import quickstart_grpo  # noqa: E402
import recipe_ask  # noqa: E402
import selection  # noqa: E402
from curves import plot_variants  # noqa: E402

PROJECT = "bench-recipes"


def stale_variants(offset: int) -> dict[str, dict]:
    """Each variant's config changes to the quickstart's GRPO stage."""
    ahead = {"synchronizer": {"sync_offset": offset}}
    return {
        "on-policy": {"algorithm": {"algorithm_type": "grpo"}},
        "grpo": {"algorithm": {"algorithm_type": "grpo"}, **ahead},
        "grpo+tis": {"algorithm": {"algorithm_type": "grpo", "rollout_is_cap": 2.0}, **ahead},
        "m2po": {"algorithm": {"algorithm_type": "m2po"}, **ahead},
    }


def gigpo_variants(discount: float) -> dict[str, dict]:
    return {
        name: {"algorithm": {"algorithm_type": name}, "workflow_args": {"discount": discount}}
        for name in ("step_wise_grpo", "gigpo")
    }


def r3l_variants(discount: float, candidates: int) -> dict[str, dict]:
    retry = {"workflow": "reflect_retry", "workflow_args": {"discount": discount, "candidates": candidates}}
    return {
        "step_wise_grpo": {
            "algorithm": {"algorithm_type": "step_wise_grpo"},
            "workflow_args": {"discount": discount},
        },
        "retry": {"algorithm": {"algorithm_type": "step_wise_grpo"}, **retry},
        "r3l": {
            "algorithm": {"algorithm_type": "step_wise_grpo", "advantage_args": {"positive_scale": 2.0}},
            **retry,
        },
    }


def stale_config(model: Path, work: Path, name: str, seed: int, change: dict, args) -> Path:
    cfg, grpo = quickstart_grpo.grpo_config(
        model, work, project=PROJECT, name=name, seed=seed, threads=1, steps=args.steps
    )
    cfg["explorer"]["eval_interval"] = args.eval_every
    grpo["algorithm"] = change["algorithm"]
    if "synchronizer" in change:
        cfg["synchronizer"] = change["synchronizer"]
    return quickstart_grpo.write(cfg, work)


def gigpo_config(model: Path, work: Path, name: str, seed: int, change: dict, args) -> Path:
    cfg = _frozenlake_config()
    grpo = cfg["stages"][1]
    cfg.update(project=PROJECT, name=name, checkpoint_root=str(work), seed=seed)
    cfg["model"] = {"path": str(model)}
    cfg["runtime"] = {"num_threads": 1}
    cfg["explorer"]["eval_interval"] = args.eval_every
    grpo["algorithm"] = change["algorithm"]
    grpo["buffer"]["total_steps"] = args.steps
    taskset = grpo["buffer"]["taskset"]
    taskset["workflow"] = change.get("workflow", "step_wise")
    taskset["workflow_args"] = {**taskset["workflow_args"], **change["workflow_args"]}
    grpo["explorer"]["eval_at_start"] = True
    grpo.setdefault("trainer", {})["save_interval"] = 0
    cfg["stages"] = [grpo]
    return quickstart_grpo.write(cfg, work)


def frozenlake_sft(work: Path) -> Path:
    """The FrozenLake example's SFT stage, run once into ``work`` (its data written first)."""
    done = work / PROJECT / "frozenlake-sft" / "checkpoints" / "sft" / "step_800" / "model"
    if (done / "model.safetensors").exists():
        return done
    subprocess.run([sys.executable, str(AGENTS / "make_data.py")], check=True)
    cfg = _frozenlake_config()
    cfg.update(project=PROJECT, name="frozenlake-sft", checkpoint_root=str(work))
    cfg["stages"] = [cfg["stages"][0]]
    path = work / "recipes-frozenlake-sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"], check=True)
    return done


def _frozenlake_config() -> dict:
    """The agents example's FrozenLake config with its data paths made absolute."""
    cfg = yaml.safe_load((AGENTS / "frozenlake.yaml").read_text())
    data = AGENTS / "data" / "frozenlake"
    cfg["model"]["tiny"]["corpus"] = [str(data / "corpus.jsonl")]
    cfg["buffer"]["eval_tasksets"][0]["path"] = str(data / "test.jsonl")
    cfg["stages"][0]["buffer"]["sft_dataset"]["path"] = str(data / "sft.jsonl")
    cfg["stages"][1]["buffer"]["taskset"]["path"] = str(data / "train.jsonl")
    cfg["monitor"] = {"progress_bar": False}
    return cfg


RECIPES = {
    # recipe: (variants(args), config writer, held-out metric, SFT model, what the table reports)
    "stale": (lambda a: stale_variants(a.offset), stale_config, "eval/test/accuracy"),
    "gigpo": (lambda a: gigpo_variants(a.discount), gigpo_config, "eval/test/success"),
    "r3l": (lambda a: r3l_variants(a.discount, a.candidates), gigpo_config, "eval/test/success"),
    "ask": (lambda a: recipe_ask.variants(), recipe_ask.config, "eval/test/success"),
}
DEFAULT_STEPS = {"stale": 100, "gigpo": 40, "r3l": 40, "ask": 40}
EXTRA = {  # per-step training metrics worth a column: name in the table -> metric
    "stale": {"staleness": "staleness/mean", "masked (m2po)": "m2po/masked_fraction"},
    "gigpo": {"rollout success": "rollout/success", "turns in anchor groups": "gigpo/turns_in_anchor_groups"},
    "r3l": {
        "rollout success": "rollout/success",
        "episodes failed": "rollout/reflect/failed",
        "failed retried": "rollout/reflect/retried",
        "retry success": "rollout/retry/success",
    },
    "ask": {  # eval/...: the last evaluation's value, not the run's mean
        "train reward": "rollout/reward_mean",
        "asked first (end)": "eval/test/asked_first",
        "needless questions (end)": "eval/test/needless",
    },
}


def start(path: Path) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"]
    with open(path.with_suffix(".log"), "w") as log:  # a file, not a pipe: runs side by side never block
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), time.perf_counter()


def collect(proc: subprocess.Popen, t0: float, path: Path, folder: Path, metric: str, recipe: str) -> dict:
    if proc.wait() != 0:
        raise RuntimeError(f"{path.name} failed:\n{path.with_suffix('.log').read_text()[-3000:]}")
    wall = round(time.perf_counter() - t0, 1)
    records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "train/loss" in r]
    extra = {}
    for label, key in EXTRA[recipe].items():
        values = [r[key] for r in (records if key.startswith("eval/") else steps) if key in r]
        if key.startswith("eval/"):  # the end of the run
            extra[label] = values[-1] if values else None
        else:
            extra[label] = sum(values) / len(values) if values else None
    return {
        "steps": len(steps),
        "curve": [(r["step"], r[metric]) for r in records if metric in r],
        "extra": extra,
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", choices=sorted(RECIPES))
    ap.add_argument(
        "--work", default=str(REPO / "benchmarks" / "workdir"), help="SFT models and runs (reused)"
    )
    ap.add_argument(
        "--model", default="", help="start from this model folder instead of the recipe's SFT run"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=None, help="a subset of the recipe's variants")
    ap.add_argument("--steps", type=int, default=0, help="RL steps (0: the example's)")
    ap.add_argument("--eval-every", type=int, default=0, help="greedy evaluation interval (0: steps / 4)")
    ap.add_argument("--offset", type=int, default=3, help="stale: synchronizer.sync_offset")
    ap.add_argument("--discount", type=float, default=0.95, help="gigpo, r3l: the step_wise workflow's γ")
    ap.add_argument("--candidates", type=int, default=4, help="r3l: samples of a retried move")
    ap.add_argument("--parallel", type=int, default=0, help="runs at once (0: every variant of a seed)")
    ap.add_argument("--tag", default="", help="suffix of the results files and run names")
    ap.add_argument(
        "--from-results",
        action="store_true",
        help="no runs: remake the table and plot from the recorded JSON",
    )
    args = ap.parse_args()
    if args.from_results:
        return remake(args.recipe, args.tag)
    args.steps = args.steps or DEFAULT_STEPS[args.recipe]
    args.eval_every = args.eval_every or max(1, args.steps // 4)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.model:
        model = Path(args.model).resolve()
    elif args.recipe == "stale":
        model = selection.sft_model(work, 800)
    elif args.recipe == "ask":
        model = recipe_ask.sft(work)
    else:
        model = frozenlake_sft(work)
    make_variants, write_config, metric = RECIPES[args.recipe]
    variants = make_variants(args)
    names = args.variants or list(variants)
    jobs = [(seed, name) for seed in args.seeds for name in names]
    width = args.parallel or len(names)
    rows = []
    while jobs:
        running = []
        for seed, name in jobs[:width]:
            run_name = f"{args.recipe}-{name}-s{seed}{args.tag}"
            path = write_config(model, work, run_name, seed, variants[name], args)
            running.append((seed, name, path, work / PROJECT / run_name, *start(path)))
        jobs = jobs[width:]
        for seed, name, path, folder, proc, t0 in running:
            row = collect(proc, t0, path, folder, metric, args.recipe)
            row.update(variant=name, seed=seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    recorded = {**vars(args), "work": os.path.relpath(work, REPO), "model": os.path.relpath(model, REPO)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"recipes_{args.recipe}{args.tag}"
    date = time.strftime("%Y-%m-%d")
    (RESULTS / f"{stem}.json").write_text(
        json.dumps({"args": recorded, "date": date, "rows": rows}, indent=1)
    )
    table = markdown(rows, names, args, metric, recorded["model"])
    (RESULTS / f"{stem}.md").write_text(table)
    plot(rows, names, args, metric, REPO / "docs" / f"{stem}.png")
    print("\n" + table)
    return 0


def remake(recipe: str, tag: str) -> int:
    """The table and plot of ``recipes_<recipe><tag>.json``, as the run that recorded it wrote them."""
    stem = f"recipes_{recipe}{tag}"
    recorded = json.loads((RESULTS / f"{stem}.json").read_text())
    args = argparse.Namespace(**recorded["args"])
    rows, metric = recorded["rows"], RECIPES[recipe][2]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    table = markdown(rows, names, args, metric, recorded["args"]["model"], date=recorded.get("date"))
    (RESULTS / f"{stem}.md").write_text(table)
    plot(rows, names, args, metric, REPO / "docs" / f"{stem}.png")
    print(table)
    return 0


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def markdown(
    rows: list[dict], names: list[str], args, metric: str, model: str, date: str | None = None
) -> str:
    seeds = sorted({r["seed"] for r in rows})
    extra = list(EXTRA[args.recipe])
    lines = [
        f"# benchmarks/recipes.py {args.recipe} ({date or time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
        f"{args.steps} steps from {model}, seeds {', '.join(map(str, seeds))})",
        "",
        f"Greedy `{metric}` on the held-out set at the start and the end of each run; mean ± sample std over "
        "the seeds; the per-step training metrics averaged over each run, then over the seeds.",
        "",
        f"| variant | start | end (per seed) | end, mean ± std | gain, mean | {' | '.join(extra)} | wall s |",
        "|---|---|---|---|---|" + "---|" * len(extra) + "---|",
    ]
    for name in names:
        mine = sorted((r for r in rows if r["variant"] == name), key=lambda r: r["seed"])
        if not mine:
            continue
        starts = [r["curve"][0][1] for r in mine]
        ends = [r["curve"][-1][1] for r in mine]
        gains = [e - s for s, e in zip(starts, ends)]
        cols = []
        for label in extra:
            values = [r["extra"][label] for r in mine if r["extra"][label] is not None]
            cols.append(f"{statistics.fmean(values):.3f}" if values else "")
        lines.append(
            f"| {name} | {statistics.fmean(starts):.3f} | {', '.join(f'{e:.3f}' for e in ends)} | "
            f"{spread(ends)} | {statistics.fmean(gains):+.3f} | {' | '.join(cols)} | "
            f"{statistics.fmean(r['wall_s'] for r in mine):.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], names: list[str], args, metric: str, out: Path) -> None:
    what = {
        "stale": f"explorer {getattr(args, 'offset', '?')} steps ahead",
        "gigpo": "FrozenLake, step_wise",
        "r3l": "FrozenLake, reflect and retry",
        "ask": "asking for a missing number",
    }
    title = f"benchmarks/recipes.py {args.recipe} ({what.get(args.recipe, '')})"
    plot_variants(rows, names, "variant", f"greedy {metric}", title, out)


if __name__ == "__main__":
    sys.exit(main())
