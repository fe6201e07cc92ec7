"""The trainer's attention in bf16 on CPU: ``models/attention.py``'s ShortAttention against sdpa, and causal
attention for right-padded rows against an explicit padding mask, side by side in one process.

    python benchmarks/attention.py              # ~4 min on 2 cores; run it alone on the machine
    python benchmarks/attention.py --no-write   # print only

Three tables, each pair alternating, the fastest of ``--rounds`` reported (the first call of each is a
warm-up):

1. **The op**: forward + backward of causal attention over ~4k tokens a call (rows x length), bf16, for the
   25M model's heads (8 / 4 KV, dim 64) and Qwen2.5-0.5B's (14 / 2): ``ShortAttention`` against
   ``scaled_dot_product_attention(is_causal=True)`` (torch's CPU flash kernel).
2. **A GRPO train step** of the 25M model (``benchmarks/ladder_parts.py``'s shape, random weights) on 64
   random experiences of 120-208 tokens (``micro_batch.random_grpo_batch``), ``trainer.precision: bf16``:
   the trainer as it is (its models switched to ``"trivium"``) against the same trainer with sdpa put back.
3. **Padding**: a bf16 forward + backward of the 25M model over right-padded rows (each row 0-128 tokens
   shorter than the longest), with the 2-D padding mask (transformers then builds a 4-D mask and sdpa
   computes every block) against no mask (``TrainBatch.attention_inputs``: sdpa runs ``is_causal``).

Writes benchmarks/results/attention.md and attention.json.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from ladder_parts import qwen2_config  # noqa: E402
from micro_batch import random_grpo_batch  # noqa: E402

from trivium.models.attention import SHORT_KEYS  # noqa: E402

HEADS = {"25M": (8, 4), "0.5B": (14, 2)}
LENGTHS = (128, 160, 192, 256, 384, 512, 1024)


def pairs(calls: dict, rounds: int) -> dict[str, float]:
    """The fastest of ``rounds`` timed calls of each, alternating, after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds + 1):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            if r:
                times[name].append(time.perf_counter() - t0)
    return {name: min(t) for name, t in times.items()}


def op_calls(q, k, v, grad) -> dict:
    import torch.nn.functional as F

    from trivium.models.attention import ShortAttention

    def short():
        ShortAttention.apply(q, k, v, None, 0.125).backward(grad)

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125, enable_gqa=True).backward(grad)

    return {"short": short, "sdpa": sdpa}


def op_table(rounds: int) -> list[dict]:
    rows = []
    for shape, (h, kv) in HEADS.items():
        for n in LENGTHS:
            b = max(1, 4096 // n)
            gen = torch.Generator().manual_seed(n)
            q, k, v = (
                torch.randn(b, heads, n, 64, generator=gen).to(torch.bfloat16).requires_grad_()
                for heads in (h, kv, kv)
            )
            grad = torch.randn(b, h, n, 64, generator=gen).to(torch.bfloat16)

            got = pairs(op_calls(q, k, v, grad), rounds)
            rows.append({"heads": f"{h} / {kv}", "shape": shape, "rows": b, "length": n, **got})
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def step_table(rounds: int) -> dict:
    from transformers import AutoModelForCausalLM

    from trivium.config.schema import AlgorithmConfig, TrainerConfig
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen2_config("25M"), dtype=torch.float32)
    experiences = random_grpo_batch(model.config.vocab_size)
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo"))
    trainers = {}
    for name in ("trivium", "sdpa"):
        tcfg = TrainerConfig(lr=1e-6, micro_batch_size=32, precision="bf16")
        trainers[name] = Trainer(
            copy.deepcopy(model), tcfg, spec, pad_token_id=0, total_steps=rounds + 2, max_response_length=128
        )
    trainers["sdpa"].model.config._attn_implementation = "sdpa"  # as before this change
    assert trainers["trivium"].model.config._attn_implementation == "trivium"
    got = pairs({name: lambda t=t: t.train_step(experiences) for name, t in trainers.items()}, rounds)
    print(got, file=sys.stderr, flush=True)
    return got


def padded_pass(model, ids, real, attention_mask, position_ids):
    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(
                input_ids=ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                output_hidden_states=True,
                logits_to_keep=torch.empty(0, dtype=torch.long),
            )
        out.hidden_states[-1].float()[real.bool()].square().mean().backward()
        model.zero_grad()

    return call


def padding_table(rounds: int) -> list[dict]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen2_config("25M"), dtype=torch.float32)
    rows = []
    for b, n in ((32, 160), (8, 1024), (2, 4096)):
        gen = torch.Generator().manual_seed(n)
        ids = torch.randint(1, 500, (b, n), generator=gen)
        lengths = n - torch.randint(0, 129, (b,), generator=gen)
        lengths[0] = n
        mask = (torch.arange(n) < lengths.unsqueeze(-1)).long()
        positions = torch.arange(n).expand(b, n)

        mask_call = padded_pass(model, ids, mask, mask, positions * mask)
        got = pairs({"mask": mask_call, "causal": padded_pass(model, ids, mask, None, positions)}, rounds)
        rows.append({"rows": b, "length": n, **got})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only, keep the results files")
    args = ap.parse_args()
    ops, step, padding = op_table(args.rounds), step_table(args.rounds), padding_table(args.rounds)
    when = datetime.date.today().isoformat()
    lines = [
        f"Measured on {platform.machine()}, {when}, `python benchmarks/attention.py` ({torch.get_num_threads()} "
        f"threads, fastest of {args.rounds} after a warm-up, pairs alternating).",
        "",
        "Causal attention, forward + backward, bf16, head dim 64, ~4k tokens a call:",
        "",
        "| heads / KV heads | rows x length | sdpa ms | ShortAttention ms | ShortAttention / sdpa |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in ops:
        lines.append(
            f"| {r['heads']} ({r['shape']}) | {r['rows']} x {r['length']} | {r['sdpa'] * 1e3:.1f} | "
            f"{r['short'] * 1e3:.1f} | {r['short'] / r['sdpa']:.2f} |"
        )
    lines += [
        "",
        "A GRPO train step, 25M model, 64 experiences of 120-208 tokens, micro-batches of 32, bf16:",
        "",
        "| attention | s per step | vs sdpa |",
        "| --- | --- | --- |",
        f"| sdpa | {step['sdpa']:.2f} | 1.00 |",
        f"| trivium (ShortAttention up to {SHORT_KEYS} keys) | {step['trivium']:.2f} | {step['trivium'] / step['sdpa']:.2f} |",
        "",
        "Right-padded rows, 25M model, bf16 forward + backward (sdpa both):",
        "",
        "| rows x length | padding mask s | causal only s | causal / mask |",
        "| --- | --- | --- | --- |",
    ]
    for r in padding:
        lines.append(
            f"| {r['rows']} x {r['length']} | {r['mask']:.2f} | {r['causal']:.2f} | {r['causal'] / r['mask']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        out = BENCH / "results" / "attention"
        out.with_suffix(".md").write_text("# benchmarks/attention.py\n\n" + text)
        payload = {"date": when, "ops": ops, "step": step, "padding": padding}
        out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
