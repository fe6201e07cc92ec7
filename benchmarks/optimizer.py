"""AdamW's update by implementation (trainer.optimizer_impl, and bf16 moments: trainer.optimizer_state_dtype) at
the ladder's model shapes, side by side.

    python benchmarks/optimizer.py                   # 1M, 25M, 100M and the 0.5B shape (~3 min, 9 GB at 0.5B)
    python benchmarks/optimizer.py --shapes 1M 25M   # fewer

Each shape is a random-initialised Qwen2 of ``benchmarks/ladder_parts.py``'s SHAPES (the update's cost does not
depend on the weights) with random gradients, in fp32 (master weights and optimizer state are fp32 under every
trainer.precision). The optimizer is ``trivium.trainer.optim.build_optimizer``, the trainer's own: per round,
each implementation in turn builds its AdamW, takes one step (the state's first allocation, not timed), then
``--steps`` timed steps; ``--rounds`` rounds alternate the implementations so that the machine's drift hits
all of them alike. Reported: the median ms per update, its ratio to for_loop (torch's default on CPU), and
the optimizer state's size.
Writes benchmarks/results/optimizer.md and optimizer.json. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from ladder_parts import SHAPES, publish, qwen2_config  # noqa: E402

# label: TrainerConfig settings (the optimizer's only)
SETTINGS = {
    "for_loop": {"optimizer_impl": "for_loop"},
    "foreach": {"optimizer_impl": "foreach"},
    "fused": {"optimizer_impl": "fused"},
    "bf16 moments": {"optimizer_state_dtype": "bfloat16"},
}
IMPLS = list(SETTINGS)


def random_model(shape: str):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(shape))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    return model


def time_shape(shape: str, steps: int, rounds: int) -> dict:
    from trivium.config.schema import TrainerConfig
    from trivium.trainer.optim import build_optimizer

    model = random_model(shape)
    params = sum(p.numel() for p in model.parameters())
    times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    state: dict[str, int] = {}
    for _ in range(rounds):
        for impl in IMPLS:
            optimizer = build_optimizer(model.parameters(), TrainerConfig(lr=1e-6, **SETTINGS[impl]))
            optimizer.step()
            for _ in range(steps):
                t0 = time.perf_counter()
                optimizer.step()
                times[impl].append(time.perf_counter() - t0)
            state[impl] = sum(
                t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim()
            )
            del optimizer
            gc.collect()
    medians = {impl: statistics.median(ts) * 1e3 for impl, ts in times.items()}
    return {
        "shape": shape,
        "params_m": params / 1e6,
        "ms": medians,
        "vs_for_loop": {impl: ms / medians["for_loop"] for impl, ms in medians.items()},
        "state_mb": {impl: b / 2**20 for impl, b in state.items()},
    }


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1M", "25M", "100M", "0.5B"], choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=3, help="timed updates per implementation and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only (tests)")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes:
        rows.append(time_shape(shape, args.steps, args.rounds))
        r = rows[-1]
        print(
            f"{shape:>6} ({r['params_m']:.1f}M params): "
            + ", ".join(f"{impl} {r['ms'][impl]:.1f} ms ({r['vs_for_loop'][impl]:.2f}x)" for impl in IMPLS),
            flush=True,
        )
    lines = [
        "# AdamW's update by implementation (benchmarks/optimizer.py)",
        "",
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; ms per update (median of {args.rounds} x {args.steps}), "
        "ratio to for_loop, optimizer state",
        "",
        "| shape | parameters | " + " | ".join(IMPLS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in IMPLS) + " |",
    ]
    for r in rows:
        cells = " | ".join(
            f"{r['ms'][impl]:.1f} ({r['vs_for_loop'][impl]:.2f}x), {r['state_mb'][impl]:.0f} MB"
            for impl in IMPLS
        )
        lines.append(f"| {r['shape']} | {r['params_m']:.1f}M | {cells} |")
    text = "\n".join(lines) + "\n"
    publish("optimizer", text, rows, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
