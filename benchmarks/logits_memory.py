"""Peak memory of one training forward/backward with log-probs of every position vs of the loss tokens only.

    python benchmarks/logits_memory.py                   # vocabulary 32k, 32 rows x 256 tokens, 64 of them answer

Each setting runs in its own process (peak RSS is per process). The model is a 2-layer Qwen2 of width 64
with a large vocabulary, so the [rows, tokens, vocabulary] logits dominate as they do for real models with
150k vocabularies; ``--vocab``, ``--rows``, ``--length`` and ``--answer`` change the shape.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_pass(args) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trivium.trainer.logprobs import forward_logprobs
    from trivium.types import TrainBatch

    torch.manual_seed(0)
    r, n, a = args.rows, args.length, args.answer
    cfg = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    )
    model = Qwen2ForCausalLM(cfg)
    mask = torch.zeros(r, n, dtype=torch.bool)
    mask[:, n - a :] = True
    batch = TrainBatch(
        input_ids=torch.randint(0, args.vocab, (r, n)),
        attention_mask=torch.ones(r, n, dtype=torch.long),
        position_ids=torch.arange(n).expand(r, n),
        loss_mask=mask,
        seq_index=torch.arange(r)[:, None].expand(r, n),
        rollout_logprobs=torch.zeros(r, n),
        rewards=torch.zeros(r),
        group_ids=torch.zeros(r, dtype=torch.long),
        model_versions=torch.zeros(r, dtype=torch.long),
        response_lengths=torch.full((r,), a),
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lp, _ = forward_logprobs(model, batch, only_loss_tokens=args.only == 1)
    lp[mask].sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{peak:.0f} {before:.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--only", type=int, choices=[0, 1], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only is not None:
        one_pass(args)
        return 0
    shape = f"vocab {args.vocab}, {args.rows} rows x {args.length} tokens, {args.answer} answer tokens each"
    print(f"{shape}\n\n| log-probs of | peak RSS MB | before the pass MB |\n| --- | --- | --- |")
    for only, label in ((0, "every position (full logits)"), (1, "loss tokens only")):
        sizes = ["--vocab", str(args.vocab), "--rows", str(args.rows), "--length", str(args.length)]
        cmd = [sys.executable, __file__, *sizes, "--answer", str(args.answer), "--only", str(only)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
        print(f"| {label} | {out[0]} | {out[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
