"""The trainer's step with and without shared-prompt rows (`trainer.share_prompts`), side by side.

    python benchmarks/shared_prompt_step.py          # ~1 min on 2 cores; nothing else running
    python benchmarks/shared_prompt_step.py > benchmarks/results/shared_prompt_step.md

`Trainer.train_step` (collation, one GRPO update, bf16 as `trainer.precision: auto` takes it on a CPU with
bf16 instructions, emulated elsewhere) on random Qwen2 models and tokens: one row a sample
(`share_prompts: false`) against the group in one row (`true`), alternating, the median of 3 steps each after
one warm-up. Responses alternate full and half length inside a group (rows with padding). The shapes: the
quickstart's GRPO stage (its 1M model, 42-token prompts, 24-token answers, 8 samples, 32 tasks), one in the
middle, the ladder's 25M @128 shape (where `auto` stays off) and a long-prompt one. `row tokens` is the shared
rows' tokens over one row a sample's, what `auto` compares with 0.6 (trainer/layout.py).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import platform
import statistics
import sys
import time

import torch

# (name, prompt tokens, response tokens, samples a prompt, prompts, hidden size, layers)
CASES = [
    ("quickstart GRPO (1M)", 42, 24, 8, 32, 128, 4),
    ("middle (1M)", 60, 40, 4, 32, 128, 4),
    ("25M @128 shape (h512)", 32, 96, 8, 8, 512, 4),
    ("long prompt (h512)", 200, 100, 4, 8, 512, 4),
]


def experiences(prompt: int, response: int, samples: int, prompts: int, vocab: int):
    from trivium.types import Experience

    g = torch.Generator().manual_seed(0)
    out = []
    for group in range(prompts):
        p = torch.randint(0, vocab, (prompt,), generator=g)
        for j in range(samples):
            n = response if j % 2 == 0 else response // 2
            out.append(
                Experience(
                    tokens=torch.cat([p, torch.randint(0, vocab, (n,), generator=g)]),
                    prompt_length=prompt,
                    action_mask=torch.ones(n, dtype=torch.bool),
                    logprobs=torch.full((n,), -5.0),
                    reward=float(j % 2),
                    group_id=group,
                    run_index=j,
                )
            )
    return out


def trainer(model, share: bool):
    from trivium.config.schema import AlgorithmConfig, TrainerConfig
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer

    cfg = TrainerConfig(lr=1e-4, micro_batch_size=128, share_prompts=share, precision="bf16")
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo"))
    return Trainer(copy.deepcopy(model), cfg, spec, pad_token_id=0, total_steps=10, max_response_length=128)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    print(
        f"Measured on {platform.machine()}, {datetime.date.today()}, `python benchmarks/shared_prompt_step.py` "
        f"(one GRPO train step, bf16; the median of {args.repeats} per layout, alternating).\n"
    )
    print(
        "| shape | prompt / answer x samples x prompts | row tokens | one row a sample s | shared s | shared / one row a sample |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, prompt, response, samples, prompts, hidden, layers in CASES:
        torch.manual_seed(0)
        config = Qwen2Config(
            vocab_size=384 if hidden == 128 else 8192,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=4 if hidden == 128 else 8,
            num_key_value_heads=2 if hidden == 128 else 4,
            intermediate_size=4 * hidden,
            max_position_embeddings=4096,
        )
        model = Qwen2ForCausalLM(config).float()
        exps = experiences(prompt, response, samples, prompts, config.vocab_size)
        times: dict[bool, list[float]] = {False: [], True: []}
        for share in (False, True):  # warm-up: the first pass of a shape pays for kernels
            trainer(model, share).train_step(exps)
        ratio = 0.0
        for _ in range(args.repeats):
            for share in (False, True):
                t = trainer(model, share)
                start = time.perf_counter()
                metrics = t.train_step(exps)
                times[share].append(time.perf_counter() - start)
                ratio = metrics.get("train/shared_row_tokens", ratio)
        a, b = statistics.median(times[False]), statistics.median(times[True])
        print(
            f"| {name} | {prompt} / {response} x {samples} x {prompts} | {ratio:.2f} | {a:.3f} | {b:.3f} | "
            f"{b / a:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
