"""Cost at real shapes: Trivium and TRL's GRPOTrainer side by side over a ladder of model sizes and lengths.

    pip install -e '.[bench]'                        # TRL
    python benchmarks/ladder.py --quick              # CI's slow test: the small 152k rung, 2 steps, ~1 min
    python benchmarks/ladder.py                      # every rung (~1 h on 2 CPU cores)
    python benchmarks/ladder.py --rungs 25M@128 25M@1k --steps 3
    python benchmarks/ladder.py --plot-only          # redraw ladder.png from ladder.json

Each rung is a model shape and a length (prompt + response tokens). Models are random-initialised
(``ladder_parts.py``): speed and memory do not need a trained model. Both frameworks get the same model
folder, prompts, reward (``ladder_parts.letter_reward``), group size, response length and one update per
batch (no KL, constant lr), each in its own process, alternating; a rung's first step is dropped (warm-up)
and the median of the others is reported. Each at its best settings: TRL with bf16 where the CPU multiplies bf16 in
hardware and fp32 elsewhere (``trivium.models.bf16.native_bf16``: plain torch runs bf16 products on an AVX2
CPU some 300x slower than fp32; ``--trl-fp32`` / ``--trl-bf16`` force one) and without gradient
checkpointing (its fastest); Trivium with what it chooses itself
(``trainer.precision: auto``, micro-batches of its token budget); ``--set KEY=VALUE`` adds Trivium overrides.

Per run: s/step, rollout and train seconds, generated tokens/s (of the rollout phase), trained tokens/s (of
the train phase), peak RSS, and for Trivium ``trivium doctor``'s estimate against the peak tensor memory of
a third, 2-step run measured as ``tests/launch/peak_rss.py`` does (the tensors live at the first step plus
what the steps add at their fullest; not the interpreter and libraries; ``--no-memory`` skips it). The floors are arithmetic: a step's FLOPs (the
train phase ``6·N·T`` over every token plus ``6·h·V`` at the loss tokens and causal attention; the rollout
``2·N`` per prompt and generated token plus the head ``2·h·V`` per generated token) over this machine's
matmul rate in the phase's dtype, measured at the start (2048² matmuls, all threads). A rollout decodes
one token a row per step, so its products have as many rows as samples in flight (64 at 25M@128), and
the BLAS runs those below the 2048² rate: the rollout's second floor takes the decode's products at the
rate ``decode_rate`` measures for the rung's rows and shape (what no rollout of those rows beats here).

Writes ``benchmarks/results/ladder.md``, ``ladder.json`` and ``ladder.png`` (``--out`` another prefix).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

sys.path.insert(0, str(REPO))
from ladder_parts import SHAPES, make_model, make_prompts, qwen2_config  # noqa: E402
from tests.launch.peak_rss import measure  # noqa: E402  (the doctor test's measure of peak tensor memory)

# rung: (shape, prompt tokens, response tokens, prompts per step, group size)
RUNGS = {
    "1M@64": ("1M", 40, 24, 16, 8),  # the quickstart's shape and lengths
    "25M@128": ("25M", 32, 96, 8, 8),
    "25M@1k": ("25M", 896, 128, 4, 4),
    "25M@4k": ("25M", 3968, 128, 2, 2),
    "100M@128": ("100M", 32, 96, 8, 8),
    "0.5B@128": ("0.5B", 32, 96, 4, 4),
    "0.5B@1k": ("0.5B", 896, 128, 2, 2),
    "0.5B@4k": ("0.5B", 3968, 128, 1, 2),
    "ci-152k@256": ("ci-152k", 192, 64, 2, 2),  # --quick: TRL at 152k is most of its time
}
QUICK = ["ci-152k@256"]  # the 1M rung is the doctor test's quickstart shape and the full ladder's
FULL = [r for r in RUNGS if not r.startswith("ci-")]


# --- the machine's arithmetic rate ------------------------------------------------------------------------
def matmul_rate() -> dict[str, float]:
    """FLOP/s of a 2048² matmul on all threads, fp32 and bf16 (median of 5 after a warm-up). Where the CPU has
    no bf16 instructions the bf16 rate is a 256² product's: at 2048² plain torch takes about a minute each."""
    import torch

    from trivium.models.bf16 import native_bf16

    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        n = 2048 if dtype == torch.float32 or native_bf16(torch.device("cpu"))[0] else 256
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        a @ b
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        out[name] = 2 * n**3 / statistics.median(times)
    return out


def decode_rate(shape: str, rows: int, dtype: str) -> float:
    """FLOP/s of a decode step's products at ``rows`` rows: one new token a row through every layer's
    projections (distinct weights per layer, as the model's: not cache-hot) and the head, median of 9 after
    two warm-ups. Products of a few rows run below the 2048² rate (2-core EPYC, AVX2: 64 x 512 x 1536 at 0.6x of
    it); no rollout of that many rows multiplies faster on this machine."""
    import torch
    import torch.nn.functional as F

    hidden, layers, heads, kv_heads, inter, vocab = SHAPES[shape]
    kv = kv_heads * hidden // heads
    dt = getattr(torch, dtype)
    x, xi = torch.randn(rows, hidden, dtype=dt), torch.randn(rows, inter, dtype=dt)
    outs = (hidden, kv, kv, hidden, inter, inter)
    weights = [[torch.randn(n, hidden, dtype=dt) for n in outs] + [torch.randn(hidden, inter, dtype=dt)]
               for _ in range(layers)]  # fmt: skip
    head = torch.randn(vocab, hidden, dtype=dt)

    def step() -> None:
        for layer in weights:
            for w in layer[:-1]:
                F.linear(x, w)
            F.linear(xi, layer[-1])
        F.linear(x, head)

    step()
    step()  # the first products also start the thread pool
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    flops = 2 * rows * (layers * (hidden * (sum(outs) + inter)) + vocab * hidden)
    return flops / statistics.median(times)


def shape_numbers(shape: str) -> dict[str, int]:
    """Parameters (all, and without the tied embedding) of a shape, counted on the meta device."""
    import torch
    from transformers import Qwen2ForCausalLM

    hidden, layers, _, _, _, vocab = SHAPES[shape]
    with torch.device("meta"):
        params = sum(p.numel() for p in Qwen2ForCausalLM(qwen2_config(shape)).parameters())
    return {
        "params": params,
        "body": params - vocab * hidden,
        "hidden": hidden,
        "layers": layers,
        "vocab": vocab,
    }


def floors(rung: str, run: dict, rate: dict[str, float], train_dtype: str, rollout_dtype: str) -> dict:
    """Arithmetic floors (seconds) of the run's rollout and train phases (module docstring)."""
    shape, prompt, _, prompts, group = RUNGS[rung]
    seqs = prompts * group
    train, rollout = phase_flops(shape, prompt, seqs, run["tokens_per_step"])
    out = {
        "train_s": train / rate[train_dtype],
        "rollout_s": rollout / rate[rollout_dtype],
        "trained_tokens": seqs * (prompt + run["tokens_per_step"] / seqs),
    }
    key = f"decode:{shape}:{seqs}:{rollout_dtype}"  # the rung's rows, measured once a ladder
    if key in rate:
        n = shape_numbers(shape)
        decode = 2 * (n["body"] + n["hidden"] * n["vocab"]) * run["tokens_per_step"]
        out["rollout_rows_s"] = decode / rate[key] + (rollout - decode) / rate[rollout_dtype]
    return out


def phase_flops(shape: str, prompt: int, seqs: int, generated: int) -> tuple[float, float]:
    """FLOPs of a step's training and rollout: ``seqs`` sequences of ``prompt`` tokens that generated
    ``generated`` tokens in all (module docstring)."""
    n = shape_numbers(shape)
    seq = prompt + generated / seqs
    attention = 2 * n["layers"] * seq * seq * n["hidden"]  # causal QK^T and AV, forward, one sequence
    train = 6 * n["body"] * seqs * seq + 6 * n["hidden"] * n["vocab"] * generated + 3 * attention * seqs
    rollout = 2 * n["body"] * (seqs * prompt + generated) + 2 * n["hidden"] * n["vocab"] * generated
    return train, rollout + attention * seqs


# --- the two sides ----------------------------------------------------------------------------------------
def run_trl(args, model: Path, data: Path, rung: str) -> dict:
    _, _, resp, prompts, group = RUNGS[rung]
    cmd = [sys.executable, str(BENCH / "ladder_parts.py"), "trl", str(model), str(data)]
    cmd += [str(prompts), str(group), str(resp), str(args.steps), "0" if args.trl_fp32 else "1"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return {"failed": _why(done)}
    rows = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    steps = [r for r in rows if "step_s" in r][1:]
    summary = rows[-1]["summary"]
    return _summary(
        [r["step_s"] for r in steps],
        [r["rollout_s"] for r in steps],
        [r["step_s"] - r["rollout_s"] for r in steps],
        [r["tokens"] for r in steps],
        summary["peak_rss_mb"],
    )


def trivium_config(args, model: Path, data: Path, rung: str, work: Path) -> Path:
    _, _, resp, prompts, group = RUNGS[rung]
    cfg = {
        "project": "ladder",
        "name": rung,
        "seed": 0,
        "checkpoint_root": str(work),
        "model": {"path": str(model)},
        "monitor": {"progress_bar": False},
        "algorithm": {"algorithm_type": "grpo"},
        "explorer": {
            "rollout": {"temperature": 1.0, "max_tokens": resp},
            "eval_at_start": False,
            "eval_interval": 0,
        },
        "buffer": {
            "batch_size": prompts,
            "total_steps": args.steps,
            "taskset": {
                "path": str(data),
                "repeat_times": group,
                "shuffle": False,
                "reward_fn": "ladder_parts:letter_reward",
            },
        },
        "trainer": {"lr": 1e-5, "save_interval": 0},
    }
    path = work / f"{rung}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def doctor_and_dtypes(config: Path, overrides: list[str]) -> tuple[float, str, str]:
    """``trivium doctor``'s estimate of the run's peak tensor bytes (MiB), and the dtypes the run trains
    and samples in on this machine (``trainer.precision`` resolved as the run resolves it)."""
    from trivium.launch.config_doctor import explain
    from trivium.trainer.precision import resolve
    from trivium.validation import load_config
    from trivium.validation.validate_layout import engine_dtype

    cfg = load_config(config, overrides=overrides)
    _, facts = explain(cfg)
    peak = max(f.estimate.peak for f in facts if f.estimate is not None) / 2**20
    stage = cfg.stages[0].config
    train = {"bf16": "bfloat16", "fp16": "float16"}.get(
        resolve(stage.trainer.precision, stage.model).name, "float32"
    )
    return peak, train, engine_dtype(stage)


def run_trivium(args, config: Path, work: Path, rung: str) -> dict:
    sets = [x for kv in args.overrides for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(config), "--overwrite", *sets]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return {"failed": _why(done)}
    path = work / "ladder" / rung / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "time/step" in r]
    steps = rows[1:]
    return _summary(
        [r["time/step"] for r in steps],
        [r.get("time/rollout", 0.0) for r in steps],
        [r.get("time/train", 0.0) for r in steps],
        [r.get("rollout/response_tokens", 0.0) for r in steps],
        max(r.get("train/peak_rss_mb", 0.0) for r in rows),
    )


def _summary(step_s, rollout_s, train_s, tokens, peak) -> dict:
    if not step_s:
        return {"failed": "no timed step (--steps must be >= 2: the first is dropped)"}
    return {
        "s_step": statistics.median(step_s),
        "rollout_s": statistics.median(rollout_s),
        "train_s": statistics.median(train_s),
        "tokens_per_step": statistics.mean(tokens),
        "gen_tok_s": sum(tokens) / max(sum(rollout_s), 1e-9),
        "peak_rss_mb": peak,
    }


def _why(done: subprocess.CompletedProcess) -> str:
    if done.returncode < 0 or done.returncode == 137:
        return f"killed (signal {-done.returncode if done.returncode < 0 else 9}: out of memory?)"
    tail = [x for x in (done.stderr or "").splitlines() if x.strip()][-1:]
    return f"exit {done.returncode}: {tail[0][:160] if tail else ''}"


# --- the report -------------------------------------------------------------------------------------------
def rung_result(args, rung: str, work: Path, rate: dict[str, float]) -> dict:
    """One rung: its model (made once into ``--work``), prompts, both runs, the doctor and the floors."""
    import torch

    from trivium.models.bf16 import native_bf16

    shape, prompt, _, prompts, _ = RUNGS[rung]
    model = make_model(shape, Path(args.work).resolve() / "models" / shape)
    data = make_prompts(model, prompt, prompts * args.steps, work / f"{rung}.jsonl")
    config = trivium_config(args, model, data, rung, work)
    out = {"rung": rung, "shape": shape, "params": shape_numbers(shape)["params"]}
    out["doctor_mib"], train_dtype, rollout_dtype = doctor_and_dtypes(config, args.overrides)
    trl_dtype = "float32" if args.trl_fp32 else "bfloat16"
    rows = prompts * RUNGS[rung][4]  # sampled at once by both frameworks
    for dtype in {trl_dtype, rollout_dtype}:  # measured before the runs, with nothing else on the cores
        key = f"decode:{shape}:{rows}:{dtype}"
        if key not in rate and (dtype == "float32" or native_bf16(torch.device("cpu"))[0]):
            rate[key] = decode_rate(shape, rows, dtype)  # (emulated bf16: minutes, and no one's floor)
    out["trl"] = run_trl(args, model, data, rung)
    out["trivium"] = run_trivium(args, config, work, rung)
    if not args.no_memory:
        out["measured_mib"] = measure(config, *args.overrides, "buffer.total_steps=2")["peak_mb"]
    for side, dtypes in (("trl", (trl_dtype, trl_dtype)), ("trivium", (train_dtype, rollout_dtype))):
        if "failed" not in out[side]:
            f = floors(rung, out[side], rate, *dtypes)
            out[side].update(
                floor_train_s=f["train_s"],
                floor_rollout_s=f["rollout_s"],
                floor_rollout_rows_s=f.get("rollout_rows_s"),
                train_tok_s=f["trained_tokens"] / max(out[side]["train_s"], 1e-9),
                dtypes="/".join(SHORT[d] for d in dtypes),
            )
    return out


SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def table(results: list[dict], today: str | None = None) -> list[str]:
    """The results as markdown rows; a rung measured on another day than ``today`` says its date."""
    lines = [
        "| rung | params | run | dtypes train/rollout | s/step | vs TRL | rollout s (floor; at its rows) | "
        "train s (floor) | "
        "generated tok/s | trained tok/s | peak RSS MB | doctor / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        trl = r["trl"]
        for side in ("trl", "trivium"):
            x = r[side]
            rung = r["rung"] if r.get("date", today) == today else f"{r['rung']} ({r['date']})"
            head = f"| {rung} | {r['params'] / 1e6:,.1f}M | {'TRL' if side == 'trl' else 'Trivium'} |"
            if "failed" in x:
                lines.append(f"{head} | {x['failed']} | | | | | | | |")
                continue
            ratio = f"{x['s_step'] / trl['s_step']:.2f}" if side == "trivium" and "failed" not in trl else ""
            doctor = ""
            if side == "trivium" and "measured_mib" in r:
                got = r["measured_mib"]
                doctor = f"{r['doctor_mib']:,.0f} / {got:,.0f} = {r['doctor_mib'] / got:.2f}"
            rows_floor = x.get("floor_rollout_rows_s")
            at_rows = f"; {x['rollout_s'] / rows_floor:.1f}x" if rows_floor else ""
            lines.append(
                f"{head} {x['dtypes']} | {x['s_step']:.2f} | {ratio} | {x['rollout_s']:.2f} "
                f"({x['rollout_s'] / x['floor_rollout_s']:.1f}x{at_rows}) | {x['train_s']:.2f} "
                f"({x['train_s'] / x['floor_train_s']:.1f}x) | {x['gen_tok_s']:,.0f} | {x['train_tok_s']:,.0f} | "
                f"{x['peak_rss_mb']:,.0f} | {doctor} |"
            )
    return lines


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    metrics = [("s_step", "s/step"), ("gen_tok_s", "generated tok/s"), ("train_tok_s", "trained tok/s"),
               ("peak_rss_mb", "peak RSS MB")]  # fmt: skip
    by_size = [r for r in results if r["rung"].endswith("@128") or r["rung"] == "1M@64"]
    by_len = {s: [r for r in results if r["shape"] == s] for s in ("25M", "0.5B")}
    for col, (key, label) in enumerate(metrics):
        for side, style in (("trl", "o--"), ("trivium", "s-")):
            pts = [(r["params"], r[side][key]) for r in by_size if key in r[side]]
            if pts:
                axes[0, col].plot(*zip(*pts), style, label=side)
            for shape, rows in by_len.items():
                pts = [
                    (RUNGS[r["rung"]][1] + RUNGS[r["rung"]][2], r[side][key]) for r in rows if key in r[side]
                ]
                if pts:
                    axes[1, col].plot(*zip(*pts), style, label=f"{side} {shape}")
        axes[0, col].set(xscale="log", yscale="log", xlabel="parameters (~128 tokens)", ylabel=label)
        axes[1, col].set(xscale="log", yscale="log", xlabel="prompt + response tokens", ylabel=label)
        axes[1, col].set_xticks([128, 1024, 4096], ["128", "1k", "4k"], minor=False)
        axes[1, col].set_xticks([], minor=True)
        axes[0, col].legend(fontsize=7)
        axes[1, col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rungs", nargs="*", choices=list(RUNGS), help="default: every rung but the CI one")
    ap.add_argument("--quick", action="store_true", help=f"rungs {QUICK}, 2 steps (one timed)")
    ap.add_argument(
        "--steps", type=int, help="steps per run, the first dropped (default: 3, and 2 at the 0.5B rungs)"
    )
    ap.add_argument(
        "--trl-fp32",
        action="store_true",
        help="TRL in fp32 (default: bf16 where the CPU has bf16 instructions)",
    )
    ap.add_argument("--trl-bf16", action="store_true", help="TRL in bf16 even where the CPU emulates it")
    ap.add_argument("--no-memory", action="store_true", help="skip the doctor's check (a third run per rung)")
    ap.add_argument(
        "--memory-only",
        action="store_true",
        help="only the doctor's check of --rungs, written into their rows of the --out prefix's JSON (the "
        "timings kept)",
    )
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the --out prefix's JSON")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="rungs not run this time keep their rows from the --out prefix's JSON (marked with their date)",
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--work", default=str(BENCH / "workdir" / "ladder"), help="models and data (reused)")
    ap.add_argument(
        "--out", default=str(BENCH / "results" / "ladder"), help="results prefix (.md .json .png)"
    )
    args = ap.parse_args()
    if args.plot_only:
        out = Path(args.out)
        plot(json.loads(out.with_suffix(".json").read_text())["results"], out.with_suffix(".png"))
        return 0
    rungs = QUICK if args.quick else (args.rungs or FULL)
    if not (args.trl_fp32 or args.trl_bf16):
        import torch

        from trivium.models.bf16 import native_bf16

        fast, why = native_bf16(torch.device("cpu"))
        args.trl_fp32 = not fast
        print(f"TRL in {'bf16' if fast else 'fp32'}: {why}", file=sys.stderr, flush=True)
    # every run imports the reward as ladder_parts:letter_reward
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    runs = Path(tempfile.mkdtemp(prefix="trivium-ladder-", dir=work))
    if args.memory_only:
        return memory_only(args, rungs, runs, Path(args.out))
    rate = matmul_rate()
    results = []
    given = args.steps or (2 if args.quick else None)  # --quick: a smoke test of every part, one timed step
    when = datetime.date.today().isoformat()
    for rung in rungs:
        args.steps = given or (2 if RUNGS[rung][0] == "0.5B" else 3)
        results.append({**rung_result(args, rung, runs, rate), "date": when})
        print(f"{rung} done", file=sys.stderr, flush=True)
    out = Path(args.out)
    if args.keep and out.with_suffix(".json").exists():
        new = {r["rung"]: r for r in results}
        old = {r["rung"]: r for r in json.loads(out.with_suffix(".json").read_text())["results"]}
        results = [new.get(rung) or old[rung] for rung in RUNGS if rung in new or rung in old]
    head = [
        f"# benchmarks/ladder.py ({when}, {os.cpu_count()} CPU threads, {platform.processor() or platform.machine()})",
        "",
        f"Matmul rate (2048², all threads): fp32 {rate['float32'] / 1e9:.0f} GFLOP/s, "
        f"bf16 {rate['bfloat16'] / 1e9:.0f} GFLOP/s. {given or '3 (0.5B: 2)'} steps a run, the first dropped. "
        f"TRL: {'fp32' if args.trl_fp32 else 'bf16'}, no gradient checkpointing. Trivium: its own choices"
        + (f" + {', '.join(args.overrides)}" if args.overrides else "")
        + ". Floors: FLOPs over the phase dtype's matmul rate; the rollout's also at the rate this machine "
        "multiplies at the rung's rows (`decode_rate`: a decode step's products, one token a row; prefill and "
        "attention at the 2048² rate). doctor / measured: `trivium doctor`'s peak "
        "estimate against the measured peak tensor memory (tests/launch/peak_rss.py, a 2-step run).",
        "",
    ]
    if any(r.get("date", when) != when for r in results):
        head.append(
            "Rungs marked with a date kept their rows from that day's run (`--keep`); the matmul rate above is today's."
        )
        head.append("")
    write(out, head, results, rate, when)
    return 0


def write(out: Path, head: list[str], results: list[dict], rate: dict, when: str) -> None:
    text = "\n".join(head + table(results, when)) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps({"rate": rate, "results": results, "head": head}, indent=1)
    )
    plot(results, out.with_suffix(".png"))


def memory_only(args, rungs: list[str], work: Path, out: Path) -> int:
    """``--memory-only``: the doctor's estimate and the measured peak of ``rungs`` again, into their rows."""
    saved = json.loads(out.with_suffix(".json").read_text())
    rows = {r["rung"]: r for r in saved["results"]}
    when = datetime.date.today().isoformat()
    for rung in rungs:
        if rung not in rows:
            raise SystemExit(f"--memory-only: {out.with_suffix('.json')} has no row of {rung}: run it first")
        shape, prompt, _, prompts, _ = RUNGS[rung]
        args.steps = 2
        model = make_model(shape, Path(args.work).resolve() / "models" / shape)
        data = make_prompts(model, prompt, prompts * args.steps, work / f"{rung}.jsonl")
        config = trivium_config(args, model, data, rung, work)
        rows[rung]["doctor_mib"] = doctor_and_dtypes(config, args.overrides)[0]
        rows[rung]["measured_mib"] = measure(config, *args.overrides, "buffer.total_steps=2")["peak_mb"]
        rows[rung]["memory_date"] = when
        print(f"{rung}: doctor {rows[rung]['doctor_mib']:,.0f} / measured {rows[rung]['measured_mib']:,.0f}")
    head = saved.get("head")
    if head is None:  # a results file from before the head was kept: the report's lines above its table
        lines = out.with_suffix(".md").read_text().splitlines()
        head = lines[: next(i for i, line in enumerate(lines) if line.startswith("| rung"))]
    head = [line for line in head if "(`--memory-only`)" not in line]
    note = f"doctor / measured of {', '.join(rungs)} re-measured {when} (`--memory-only`)."
    write(out, [*head, note, ""], list(rows.values()), saved["rate"], rows[rungs[0]].get("date", when))
    return 0


if __name__ == "__main__":
    sys.exit(main())
