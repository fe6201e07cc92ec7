"""What training a GRPO group with its prompt once would save: one train pass, separate rows against one row.

    python benchmarks/shared_prompt.py            # the ladder's 25M model at its 128, 1k and 4k rungs, ~4 min
    python benchmarks/shared_prompt.py > benchmarks/results/shared_prompt.md     # the table kept

A GRPO step trains every sample of a group as its own row, so a prompt of P tokens is run forward and
backward once per sample (TRL does the same). The same log-probs come from one row per group: the prompt
once (less its last token), then each response after a copy of the prompt's last token, at the positions it
has in its own row, attending to the shared prompt and to itself only (a boolean ``[L, L]`` mask); the
gradient is the same sum. This script times the trainer's pass (forward, a loss at every response token,
backward) over the ladder's 25M model, random weights and tokens, bf16 autocast and the trainer's attention
as `trainer.precision: auto` runs them on this CPU, micro-batches of at most 4,096 tokens, the two layouts
alternating in one process; and checks that both give the same response log-probs. The trainer trains in this
layout where it pays (`trainer.share_prompts`, trainer/layout.py); benchmarks/shared_prompt_step.py times
its whole step both ways.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

# rung: (prompt tokens, response tokens, samples per prompt, prompts): the ladder's (benchmarks/ladder.py)
CASES = {"25M@128": (32, 96, 8, 8), "25M@1k": (896, 128, 4, 4), "25M@4k": (3968, 128, 2, 2)}


def separate(prompts, responses):
    """One row per sample: ids, no mask (causal), positions."""
    ids = torch.stack([torch.cat([p, r]) for p, rs in zip(prompts, responses) for r in rs])
    loss = torch.zeros_like(ids, dtype=torch.bool)
    loss[:, prompts[0].numel() :] = True
    return ids, None, torch.arange(ids.shape[1]).expand_as(ids), loss


def shared(prompts, responses):
    """One row per prompt: ``prompt[:-1]``, then ``prompt[-1] + response`` per sample, each attending to the
    shared part and to itself."""
    rows, masks, positions, losses = [], [], [], []
    for p, rs in zip(prompts, responses):
        n, segments = p.numel(), [torch.cat([p[-1:], r]) for r in rs]
        row = torch.cat([p[:-1], *segments])
        owner = torch.cat(
            [torch.full((n - 1,), -1)] + [torch.full((s.numel(),), i) for i, s in enumerate(segments)]
        )
        col = torch.arange(row.numel())
        mask = (col[None, :] <= col[:, None]) & ((owner[None, :] == -1) | (owner[None, :] == owner[:, None]))
        pos = torch.cat([torch.arange(n - 1)] + [torch.arange(n - 1, n - 1 + s.numel()) for s in segments])
        rows.append(row), masks.append(mask), positions.append(pos)
        losses.append((owner >= 0) & (pos >= n))  # the response tokens (not the prompt's last copied)
    return torch.stack(rows), torch.stack(masks)[:, None], torch.stack(positions), torch.stack(losses)


def token_logprobs(model, ids, mask, pos, loss):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp[loss[:, 1:]]


def train_pass(model, layout, per: int) -> float:
    ids, mask, pos, loss = layout
    start = time.perf_counter()
    for i in range(0, ids.shape[0], per):
        part = slice(i, i + per)
        lp = token_logprobs(model, ids[part], None if mask is None else mask[part], pos[part], loss[part])
        lp.sum().backward()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from ladder_parts import make_model  # the ladder's model, made once
    from transformers import AutoModelForCausalLM

    from trivium.models.attention import use_short_attention

    folder = make_model("25M", REPO / "benchmarks" / "workdir" / "ladder" / "models" / "25M")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    use_short_attention(model.train())
    vocab = model.config.vocab_size
    print(
        f"Measured on {platform.machine()}, {datetime.date.today()}, `python benchmarks/shared_prompt.py` (the "
        f"median of {args.repeats} train passes per layout, alternating; max log-prob gap: the largest difference "
        "between the two layouts' response log-probs, bf16 rounding).\n"
    )
    print(
        "| rung | separate rows (tokens) | shared prompt (tokens) | separate s | shared s | shared / separate "
        "| max log-prob gap |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in args.cases:
        p_len, r_len, k, groups = CASES[case]
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, vocab, (p_len,), generator=g) for _ in range(groups)]
        responses = [
            [torch.randint(0, vocab, (r_len,), generator=g) for _ in range(k)] for _ in range(groups)
        ]
        a, b = separate(prompts, responses), shared(prompts, responses)
        with torch.no_grad():  # the same log-probs either way (bf16 rounding apart)
            la, lb = (token_logprobs(model, *x) for x in (a, b))
        gap = float((la - lb).abs().max())
        assert la.shape == lb.shape and gap < 0.1, f"{case}: the layouts' log-probs differ by {gap}"
        per_a, per_b = (max(1, 4096 // x[0].shape[1]) for x in (a, b))
        times = {"a": [], "b": []}
        for _ in range(args.repeats):
            times["a"].append(train_pass(model, a, per_a))
            times["b"].append(train_pass(model, b, per_b))
            model.zero_grad(set_to_none=True)
        ta, tb = statistics.median(times["a"]), statistics.median(times["b"])
        print(
            f"| {case} | {a[0].shape[0]} x {a[0].shape[1]} ({a[0].numel():,}) | {b[0].shape[0]} x {b[0].shape[1]} "
            f"({b[0].numel():,}) | {ta:.2f} | {tb:.2f} | {tb / ta:.2f} | {gap:.4f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
