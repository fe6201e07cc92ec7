"""The rollout engine's decode step: ``DecodeStep`` (the default for Llama-family models) against the model's
own forward, side by side in one process.

    python benchmarks/decode_step.py                              # 1M, 25M, 100M; fp32 and bf16 weights
    python benchmarks/decode_step.py --shapes 25M --dtypes float32

Per shape: the ladder's random-initialised Qwen2 (``benchmarks/ladder_parts.py``, made once into ``--work``),
loaded into two ``TransformersEngine``s with the same weights and seed, one with its ``decode_step``
removed (so it decodes through ``model.forward``, the engine before DecodeStep). The call: 8 prompts x 8
samples, 32 random prompt tokens, up to 96 new tokens at temperature 1 (the GRPO rollout shape of
docs/performance.md's profile of the 25M rollout). Per round each engine makes the call once, the two
alternating, after one warm-up call each; reported: the median seconds of a call, the tokens generated, the
ratio of the medians, and each call's arithmetic floor (``benchmarks/ladder.py``'s rollout FLOPs of the
call over this machine's 2048² matmul rate in the weights' dtype). In fp32 both engines sample the same
tokens (checked); in bf16 their roundings differ, so the samples may too.

Writes benchmarks/results/decode_step.md and decode_step.json. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ladder import matmul_rate, phase_flops  # noqa: E402
from ladder_parts import make_model, publish  # noqa: E402

PROMPTS, GROUP, PROMPT_TOKENS, NEW_TOKENS = 8, 8, 32, 96


def engines(model_dir: Path, dtype: str):
    from trivium.models.transformers_engine import TransformersEngine

    fast = TransformersEngine.from_pretrained(model_dir, device="cpu", dtype=dtype, seed=0)
    slow = TransformersEngine.from_pretrained(model_dir, device="cpu", dtype=dtype, seed=0)
    if fast.decode_step is None:
        raise SystemExit(f"{model_dir}: no DecodeStep for this model")
    slow.decode_step = None
    return {"DecodeStep": fast, "model.forward": slow}


def measure(shape: str, dtype: str, work: Path, rounds: int, rate: dict[str, float]) -> dict:
    import torch

    from trivium.models.protocol import SamplingParams

    model_dir = make_model(shape, work / "models" / shape)
    pair = engines(model_dir, dtype)
    vocab = pair["DecodeStep"].vocab_size
    special = set(pair["DecodeStep"].eos_ids) | {pair["DecodeStep"].pad_id}
    g = torch.Generator().manual_seed(0)
    prompts = []
    while len(prompts) < PROMPTS:
        ids = torch.randint(0, vocab, (PROMPT_TOKENS,), generator=g).tolist()
        if not special & set(ids):
            prompts.append(ids)
    params = SamplingParams(n=GROUP, max_tokens=NEW_TOKENS, temperature=1.0)
    seconds: dict[str, list[float]] = {name: [] for name in pair}
    tokens: dict[str, list[int]] = {name: [] for name in pair}
    samples: dict[str, list] = {}
    for r in range(rounds + 1):
        for name, engine in pair.items():
            engine.generator.manual_seed(r)  # the same draws for both in every round
            t0 = time.perf_counter()
            out = engine.generate(prompts, params)
            elapsed = time.perf_counter() - t0
            if r == 0:
                continue  # warm-up
            seconds[name].append(elapsed)
            tokens[name].append(sum(len(g.response_ids) for group in out for g in group))
            samples[name] = [g.response_ids for group in out for g in group]
    row = {"shape": shape, "dtype": dtype, "same_samples": samples["DecodeStep"] == samples["model.forward"]}
    rate_key = "bfloat16" if dtype == "bfloat16" else "float32"
    for name in pair:
        median = statistics.median(seconds[name])
        generated = statistics.median(tokens[name])
        _, flops = phase_flops(shape, PROMPT_TOKENS, PROMPTS * GROUP, generated)
        row[name] = {
            "seconds": median,
            "all_seconds": seconds[name],
            "tokens": generated,
            "tok_s": generated / median,
            "floor_s": flops / rate[rate_key],
        }
    row["ratio"] = row["DecodeStep"]["seconds"] / row["model.forward"]["seconds"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1M", "25M", "100M"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=str(REPO / "benchmarks" / "workdir" / "ladder"), help="models (reused)")
    ap.add_argument("--no-write", action="store_true", help="print only, keep the results files")
    args = ap.parse_args()
    rate = matmul_rate()
    rows = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            rows.append(measure(shape, dtype, Path(args.work).resolve(), args.rounds, rate))
            print(rows[-1], flush=True)
    lines = [
        f"Measured on {platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d')}, "
        f"`python benchmarks/decode_step.py` ({args.rounds} rounds, the two engines alternating; "
        f"matmul rate fp32 {rate['float32'] / 1e9:.0f}, bf16 {rate['bfloat16'] / 1e9:.0f} GFLOP/s).",
        "",
        "| shape | weights | model.forward s (x floor) | DecodeStep s (x floor) | DecodeStep / forward | "
        "tokens | same samples |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        f, d = row["model.forward"], row["DecodeStep"]
        lines.append(
            f"| {row['shape']} | {row['dtype']} | {f['seconds']:.3f} ({f['seconds'] / f['floor_s']:.2f}x) | "
            f"{d['seconds']:.3f} ({d['seconds'] / d['floor_s']:.2f}x) | {row['ratio']:.2f} | "
            f"{d['tokens']:.0f} / {f['tokens']:.0f} | {'yes' if row['same_samples'] else 'no'} |"
        )
    publish("decode_step", "\n".join(lines) + "\n", {"rate": rate, "rows": rows}, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
