"""Gradient checkpointing (``trainer.gradient_checkpointing``): a GRPO train step's time and peak memory with
and without, at sequences long enough that one row a pass is the trainer's smallest, and the doctor's
estimate of each peak.

    python benchmarks/recompute.py                          # 25M @1k, 25M @4k, 100M @4k (~6 min, 2 cores)
    python benchmarks/recompute.py --rungs 0.5B@4k          # the Qwen2.5-0.5B shape (~20 GB without; by hand)

Each rung runs ``trivium``'s own ``Trainer.train_step`` on the ladder's random-initialised model of that shape
(``benchmarks/ladder_parts.py``; speed and memory do not need a trained one), in fp32, on ``--rows``
sequences of the rung's length (random prompt tokens, a 128-token answer; two groups of distinct prompts,
so no prompt is shared) at one row a pass (``max_tokens_per_micro_batch`` = the length), each setting in its
own process, alternating off / on. Timed: the median of the steps after the first. Peak: the bytes of the
weights at the first step plus the process's resident memory's growth to its high-water mark over the
steps, with glibc returning every freed block of 64 KiB or more (``tests/launch/peak_rss.py``'s measure,
which is what ``trivium doctor`` estimates). Both settings must reach the same loss (the same update).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ladder_parts import SHAPES, publish, qwen2_config  # noqa: E402

RUNGS = ["25M@1k", "25M@4k", "100M@4k"]
ANSWER = 128


def rung_length(rung: str) -> tuple[str, int]:
    shape, length = rung.split("@")
    return shape, int(length.removesuffix("k")) * 1024 if length.endswith("k") else int(length)


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def one_setting(rung: str, recompute: bool, rows: int, steps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from trivium.config.schema import AlgorithmConfig, TrainerConfig
    from trivium.launch.memory_estimate import ModelShape, Shapes, estimate
    from trivium.trainer.logprobs import HEAD_CHUNK_VALUES
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer
    from trivium.types import Experience

    shape_name, length = rung_length(rung)
    torch.manual_seed(0)
    config = qwen2_config(shape_name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    experiences = [
        Experience(
            tokens=torch.randint(1, config.vocab_size, (length,), generator=gen),
            prompt_length=length - ANSWER,
            action_mask=torch.ones(ANSWER, dtype=torch.bool),
            logprobs=torch.full((ANSWER,), -1.0),
            reward=float(i % 2),
            group_id=i // 2,
        )
        for i in range(rows)
    ]
    tcfg = TrainerConfig(
        lr=1e-5,
        micro_batch_size=1,
        max_tokens_per_micro_batch=length,
        precision="fp32",
        share_prompts=False,
        gradient_checkpointing=recompute,
    )
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo"))
    trainer = Trainer(model, tcfg, spec, pad_token_id=0, total_steps=steps, max_response_length=ANSWER)
    tensors_mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
    start_mb = rss_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(trainer.train_step(experiences)["train/loss"])
        times.append(time.perf_counter() - t0)
    peak_mb = tensors_mb + rss_mb("VmHWM") - start_mb
    c = config
    shape = ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads,
        intermediate=c.intermediate_size,
        vocab=c.vocab_size,
        tied=True,
    )
    shapes = Shapes(
        experiences=rows,
        rows_per_micro=1,
        seq_len=length,
        loss_tokens=ANSWER,
        in_flight=0,
        rollout_seq=0,
        trainable=shape.params,
        frozen_copies=0,
        rollout_engine=False,
        head_chunk=max(1, HEAD_CHUNK_VALUES // c.vocab_size),
        recompute=recompute,
    )
    doctor_mb = estimate(shape, shapes, "float32", "float32").peak / 2**20
    return {
        "s_step": statistics.median(times[1:] or times),
        "first_s": times[0],
        "peak_mb": peak_mb,
        "doctor_mb": doctor_mb,
        "losses": losses,
        "params": shape.params,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rungs", nargs="+", default=RUNGS, help=f"shape@length, shapes {sorted(SHAPES)}")
    ap.add_argument("--rows", type=int, default=2, help="sequences a step (one a pass)")
    ap.add_argument("--steps", type=int, default=3, help="train steps a setting (the first not timed)")
    ap.add_argument("--no-write", action="store_true", help="print only; keep benchmarks/results as it is")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child: rung, 0/1
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_setting(args.one[0], args.one[1] == "1", args.rows, args.steps)))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "TOKENIZERS_PARALLELISM": "false"}
    results = []
    for rung in args.rungs:
        row = {"rung": rung}
        for recompute in (False, True):
            cmd = [sys.executable, __file__, "--rows", str(args.rows), "--steps", str(args.steps)]
            done = subprocess.run(
                [*cmd, "--one", rung, str(int(recompute))], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                row["on" if recompute else "off"] = {"failed": done.stderr[-2000:]}
                print(f"{rung} recompute={recompute} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            row["on" if recompute else "off"] = json.loads(done.stdout.splitlines()[-1])
            print(f"{rung} recompute={recompute} done", file=sys.stderr, flush=True)
        results.append(row)
    lines = [
        "| rung | params | gradient_checkpointing | s/step | vs off | peak MB | vs off | doctor / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results:
        off = row.get("off", {})
        for key in ("off", "on"):
            r = row.get(key, {})
            if "failed" in r or not r:
                lines.append(f"| {row['rung']} | | {key} | failed | | | | |")
                continue
            vs = (lambda a, b: f"{a / b:.2f}x") if off and "failed" not in off else (lambda a, b: "")
            lines.append(
                f"| {row['rung']} | {r['params'] / 1e6:.1f}M | {key} | {r['s_step']:.2f} "
                f"| {vs(r['s_step'], off.get('s_step', 1))} | {r['peak_mb']:,.0f} "
                f"| {vs(r['peak_mb'], off.get('peak_mb', 1))} "
                f"| {r['doctor_mb']:,.0f} / {r['peak_mb']:,.0f} = {r['doctor_mb'] / r['peak_mb']:.2f} |"
            )
        on = row.get("on", {})
        if "losses" in off and "losses" in on:
            worst = max(abs(a - b) for a, b in zip(off["losses"], on["losses"]))
            row["loss_abs_diff_max"] = worst
            lines.append(f"|  |  | loss off vs on, every step: max abs difference {worst:.2e} | | | | | |")
    publish("recompute", "\n".join(lines) + "\n", results, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
