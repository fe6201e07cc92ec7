"""Resident memory that bf16 work on CPU keeps: oneDNN's kernels, one set per tensor shape.

    python benchmarks/bf16_memory.py        # ~3 min on 2 cores; each case in a fresh process

On CPU torch runs 16-bit matrix products through oneDNN, which builds a kernel for every shape it meets and
keeps up to 1,024 of them (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``); float32 products go to the BLAS, which keeps
nothing. Work whose shapes keep changing therefore grows the process in bf16 and not in fp32. Two cases:

- ``decode``: a decode step's attention, one query a row over a cache whose length grows by one each step
  (512 lengths), as ``models/decode_step.py``'s ``_attend`` computes it now (float32 on CPU) and as it did
  before (bf16 products);
- ``train``: 200 forward and backward passes of the ladder's 1M model on batches of random shape (1-8 rows of
  40-200 tokens), under bf16 autocast (``trainer.precision: bf16``) and in fp32; and in bf16 with the widths
  rounded up to a multiple of 32 (fewer shapes, a little padding).

Each runs with glibc's defaults and with ``MALLOC_MMAP_THRESHOLD_=65536`` (large blocks returned to the
system when freed, as ``tests/launch/peak_rss.py`` measures), and prints the resident memory at the start and
the end. Results: docs/performance.md ("A bf16 engine's memory grew with every call").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = r"""
import random, sys, torch
sys.path[:0] = [{repo!r}, {bench!r}]
from tests.launch.peak_rss import rss_mb
torch.set_num_threads(1)
case, variant = {case!r}, {variant!r}
if case == "decode":
    from trivium.models.decode_step import _attend
    q, mask = torch.randn(16, 8, 1, 64, dtype=torch.bfloat16), torch.zeros(16, 1, 1, 1024)
    def attend(q, k, mask):
        if variant == "float32 (now)":
            return _attend(q, k, k, mask, 0.125)
        scores = torch.matmul(q.reshape(16, 4, 2, 64), k.transpose(-1, -2)).float()
        return torch.matmul((scores * 0.125 + mask).softmax(-1).to(k.dtype), k)
    attend(q, torch.randn(16, 4, 64, 64, dtype=torch.bfloat16), mask[..., :64])
    start = rss_mb()
    for n in range(96, 608):
        attend(q, torch.randn(16, 4, n, 64, dtype=torch.bfloat16), mask[..., :n])
else:
    from ladder_parts import make_model
    from transformers import AutoModelForCausalLM
    from pathlib import Path
    folder = make_model("1M", Path({work!r}))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    rng = random.Random(0)
    start = None
    for i in range(200):
        rows, width = rng.randrange(1, 9), rng.randrange(40, 200)
        if variant.startswith("bf16, widths"):  # what the trainer's micro-batches do (trainer/logprobs.py)
            width = -(-width // 32) * 32
        ids = torch.randint(0, 300, (rows, width))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant.startswith("bf16")):
            model(input_ids=ids, use_cache=False).logits.float().mean().backward()
        start = rss_mb() if start is None else start
print(f"{{start:.0f}} {{rss_mb():.0f}}")
"""

CASES = [
    ("decode", "float32 (now)"),
    ("decode", "bf16 (before)"),
    ("train", "fp32"),
    ("train", "bf16 autocast"),
    ("train", "bf16, widths a multiple of 32"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=[v for _, v in CASES], choices=[v for _, v in CASES])
    args = ap.parse_args()
    work = str(REPO / "benchmarks" / "workdir" / "ladder" / "models" / "1M")
    print("| case | products | glibc | RSS at start MB | RSS at end MB | grown MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case, variant in CASES:
        if variant not in args.variants:
            continue
        for malloc in ("default", "MALLOC_MMAP_THRESHOLD_=65536"):
            env = dict(os.environ)
            env.pop("MALLOC_MMAP_THRESHOLD_", None)
            if malloc != "default":
                env["MALLOC_MMAP_THRESHOLD_"] = "65536"
            code = WORKER.format(
                repo=str(REPO), bench=str(REPO / "benchmarks"), case=case, variant=variant, work=work
            )
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise SystemExit(out.stderr[-2000:])
            start, end = (float(x) for x in out.stdout.split()[-2:])
            print(
                f"| {case} | {variant} | {malloc} | {start:,.0f} | {end:,.0f} | {end - start:,.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
