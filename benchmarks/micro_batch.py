"""Speed and peak memory of one GRPO train step against the micro-batch split (token budget or rows).

    python benchmarks/micro_batch.py            # the 25M model, 64 rows of 60-80 prompt + 60-128 answer tokens

Every setting runs ``trivium``'s own ``Trainer.train_step`` on the same 64 experiences (8 groups x 8, random
tokens and 0/1 rewards) of ``benchmarks/engines.py``'s 25M model (hidden 512, 8 layers; its SFT checkpoint,
made once into ``--work``, is the one ``benchmarks/vs_trl.py --workload w25m`` starts from), in fp32, each
setting in its own process (peak RSS is per process): one warm-up step, then ``--steps`` timed steps (median
reported). The settings are ``trainer.max_tokens_per_micro_batch`` budgets (0: off, the whole batch in one
pass) and a rows-only cap, so that the default's trade-off (docs/performance.md) can be seen side by side.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (label, micro_batch_size, max_tokens_per_micro_batch)
SETTINGS = [
    ("one pass (budget 0)", 64, 0),
    ("budget 8192 tokens", 64, 8192),
    ("budget 4096 tokens (default)", 64, 4096),
    ("budget 2048 tokens", 64, 2048),
    ("8 rows (budget 0)", 8, 0),
]


def random_grpo_batch(vocab: int, rows: int = 64, group: int = 8, seed: int = 1) -> list:
    """``rows`` experiences in groups of ``group``: 60-80 random prompt tokens, 60-128 answer tokens, 0/1
    rewards (a train step's cost does not depend on what the tokens say)."""
    import torch

    from trivium.types import Experience

    gen = torch.Generator().manual_seed(seed)
    experiences = []
    for i in range(rows):
        prompt = int(torch.randint(60, 80, (1,), generator=gen))
        answer = int(torch.randint(60, 129, (1,), generator=gen))
        experiences.append(
            Experience(
                tokens=torch.randint(1, vocab, (prompt + answer,), generator=gen),
                prompt_length=prompt,
                action_mask=torch.ones(answer, dtype=torch.bool),
                logprobs=torch.full((answer,), -1.0),
                reward=float(torch.randint(0, 2, (1,), generator=gen)),
                group_id=i // group,
            )
        )
    return experiences


def one_setting(model_dir: str, micro: int, budget: int, steps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from trivium.config.schema import AlgorithmConfig, TrainerConfig
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer
    from trivium.types import collate

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    experiences = random_grpo_batch(model.config.vocab_size)
    tcfg = TrainerConfig(lr=1e-5, micro_batch_size=micro, max_tokens_per_micro_batch=budget, precision="fp32")
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo"))
    trainer = Trainer(model, tcfg, spec, pad_token_id=0, total_steps=steps + 1, max_response_length=128)
    trainer.train_step(experiences)  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.train_step(experiences)
        times.append(time.perf_counter() - t0)
    rows = trainer._micro_rows(collate(experiences, 0))
    return {
        "s_per_step": statistics.median(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows_per_pass": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per setting (median reported)")
    ap.add_argument("--work", default=str(REPO / "benchmarks" / "workdir"), help="models and data (reused)")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # child: model micro_batch_size budget
    args = ap.parse_args()
    if args.one:
        model_dir, micro, budget = args.one
        print(json.dumps(one_setting(model_dir, int(micro), int(budget), args.steps)))
        return 0
    sys.path.insert(0, str(REPO / "benchmarks"))
    from engines import w25m_model

    model = w25m_model(Path(args.work).resolve())
    results = []
    for label, micro, budget in SETTINGS:
        cmd = [
            sys.executable,
            __file__,
            "--steps",
            str(args.steps),
            "--one",
            str(model),
            str(micro),
            str(budget),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append((label, json.loads(out.splitlines()[-1])))
        print(f"{label} done", file=sys.stderr, flush=True)
    base = results[0][1]
    print("| setting | rows per pass | s per train step (median) | vs one pass | peak RSS MB | vs one pass |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, r in results:
        print(
            f"| {label} | {r['rows_per_pass']} | {r['s_per_step']:.2f} | {r['s_per_step'] / base['s_per_step']:.2f}x "
            f"| {r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
