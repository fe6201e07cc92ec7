"""What `trainer.compile` buys: a GRPO train step with the decoder layers compiled against eager, side by side.

    python benchmarks/compile.py                           # the 1M and 25M shapes, fp32 and bf16 (~6 min)
    python benchmarks/compile.py --shapes 1M --precisions fp32 --steps 2   # a smoke run

Every setting runs ``trivium``'s own ``Trainer.train_step`` on the same 64 experiences (8 groups x 8, 60-80
prompt and 60-128 answer tokens, ``micro_batch.random_grpo_batch``) of a random-initialised Qwen2 of the
ladder's shape (``ladder_parts.SHAPES``; a step's cost does not depend on the weights), each setting in its
own process, so that every compiled run pays its compile (torch's on-disk inductor cache, kept between
processes, makes a repeated compile cheaper: the first run on a machine pays more). Pairs
(eager, compiled) alternate per precision. Reported per setting: the first step (with the compile), the
median of the next ``--steps``, and for the compiled run its speed-up and the steps after which the compile
has paid for itself. bf16 means the hardware's own bf16 where it has it; on a CPU without bf16 instructions
the trainer emulates bf16 and does not compile (the row says so), so measure fp32 there.
Writes benchmarks/results/compile.md and compile.json. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ladder_parts import publish, qwen2_config  # noqa: E402


def one_setting(shape: str, precision: str, compiled: bool, steps: int) -> dict:
    import torch
    from micro_batch import random_grpo_batch
    from transformers import Qwen2ForCausalLM

    from trivium.config.schema import AlgorithmConfig, TrainerConfig
    from trivium.trainer.parallel import decoder_layers
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(shape))
    experiences = random_grpo_batch(model.config.vocab_size)
    tcfg = TrainerConfig(lr=1e-5, precision=precision, compile=compiled)
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo"))
    trainer = Trainer(model, tcfg, spec, pad_token_id=0, total_steps=steps + 1, max_response_length=128)
    t0 = time.perf_counter()
    trainer.train_step(experiences)
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.train_step(experiences)
        times.append(time.perf_counter() - t0)
    return {
        "first_s": first,
        "s_per_step": statistics.median(times),
        "compiled_layers": sum(layer._compiled_call_impl is not None for layer in decoder_layers(model)),
        "precision": trainer.precision.name,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| shape | precision | trainer.compile | first step s | s/step after | vs eager | compile paid back after |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        eager = next(
            e
            for e in rows
            if (e["shape"], e["precision_asked"]) == (r["shape"], r["precision_asked"]) and not e["compile"]
        )
        ratio = r["s_per_step"] / eager["s_per_step"]
        saved = eager["s_per_step"] - r["s_per_step"]
        extra = r["first_s"] - eager["first_s"]
        if not r["compile"]:
            payback = ""
        elif r["compiled_layers"] == 0:
            payback = "not compiled (bf16 emulation)"
        else:
            payback = f"{extra / saved:.0f} steps" if saved > 0 else "never (no faster)"
        lines.append(
            f"| {r['shape']} | {r['precision']} | {'on' if r['compile'] else 'off'} | {r['first_s']:.1f} | "
            f"{r['s_per_step']:.3f} | {ratio:.2f}x | {payback} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1M", "25M"], help="ladder_parts.SHAPES rungs")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=4, help="timed steps after the first (median reported)")
    ap.add_argument("--no-write", action="store_true", help="print only (tests)")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # child: shape precision compile(0/1)
    args = ap.parse_args()
    if args.one:
        shape, precision, compiled = args.one
        print(json.dumps(one_setting(shape, precision, compiled == "1", args.steps)))
        return 0
    import torch

    rows = []
    for shape in args.shapes:
        for precision in args.precisions:
            for compiled in (False, True):
                cmd = [sys.executable, __file__, "--steps", str(args.steps), "--one", shape, precision]
                out = subprocess.run([*cmd, str(int(compiled))], check=True, capture_output=True, text=True)
                result = json.loads(out.stdout.splitlines()[-1])
                rows.append({"shape": shape, "precision_asked": precision, "compile": compiled, **result})
                print(f"{shape} {precision} compile={compiled}: {result}", file=sys.stderr, flush=True)
    text = (
        "# trainer.compile against eager (benchmarks/compile.py)\n\n"
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads; GRPO train step on 64 experiences, median of {args.steps} steps after the first\n\n"
        + table(rows)
        + "\n"
    )
    publish("compile", text, rows, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
