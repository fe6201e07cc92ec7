"""The end of a GRPO rollout on CPU, where the quickstart's step spent time outside the engine: 32 workflow
threads (a thread per task, ``explorer.max_concurrency: 0``) get their 8 samples each back from one batched
engine call together, and each scores its samples (a reward under ``reward_timeout_s``) and turns them into
experiences. Side by side, alternating, the median of ``--rounds``:

    python benchmarks/helper_calls.py            # ~20 s
    python benchmarks/helper_calls.py --threads 64 --samples 4

- ``thread a call, torch tensors``: how it was done before: a new thread for each reward call
  (``Thread.start`` waits for the thread to run), experiences built with torch's constructors;
- ``kept helpers, torch tensors``: reward calls in kept helper threads (``trivium.threads.call_in_helper``);
- ``kept helpers, numpy tensors``: what runs now (``rewards/guard.py``, ``workflows/base.py``);
- ``no time limit``: the reward in the workflow's own thread (``reward_timeout_s: 0``), for reference.

The rewards and experiences are the quickstart's (``math_verify``, ~60 prompt and 24 response tokens).
Writes benchmarks/results/helper_calls.md. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trivium.models.protocol import Generation
from trivium.rewards.guard import guarded_reward
from trivium.rewards.registry import get_reward_fn
from trivium.types import Experience, Task
from trivium.workflows.base import experience_from_generation

RESULTS = Path(__file__).resolve().parent / "results"
TASK = Task(
    task_id="t",
    workflow="math",
    reward_fn="math_verify",
    data={"question": "Leo has 8 apples. Leo wins 3 more apples. How many?", "answer": "8+3=11\n#### 11"},
)
ANSWERS = ["8+3=11\n#### 11", "8-3=5\n#### 5", "so apples, so add"]


def generations(n: int) -> list[Generation]:
    return [
        Generation(
            prompt_ids=tuple(range(60)),
            response_ids=tuple(range(24)),
            logprobs=(-0.1,) * 24,
            finish_reason="stop",
            text=ANSWERS[i % len(ANSWERS)],
        )
        for i in range(n)
    ]


def thread_a_call_reward(timeout_s: float) -> Callable:
    """The reward guard as it was: a new thread for each call, joined with the time limit."""
    plain = get_reward_fn("math_verify", None)

    def reward(response, data):
        box = {}
        thread = threading.Thread(target=lambda: box.update(value=plain(response, data)), daemon=True)
        thread.start()
        thread.join(timeout_s)
        return box["value"]

    return reward


def torch_experience(gen: Generation, reward: float, run_index: int, metrics) -> Experience:
    """``experience_from_generation`` as it was: torch's constructors."""
    response = torch.tensor(gen.response_ids, dtype=torch.long)
    return Experience(
        tokens=torch.cat([torch.tensor(gen.prompt_ids, dtype=torch.long), response]),
        prompt_length=len(gen.prompt_ids),
        action_mask=torch.ones(len(gen.response_ids), dtype=torch.bool),
        logprobs=torch.tensor(gen.logprobs, dtype=torch.float32),
        reward=float(reward),
        task_id=TASK.task_id,
        run_index=run_index,
        info={"response": gen.text, "finish_reason": gen.finish_reason},
        metrics={**metrics, "response_length": float(len(gen.response_ids))},
    )


def numpy_experience(gen: Generation, reward: float, run_index: int, metrics) -> Experience:
    return experience_from_generation(gen, reward=reward, task=TASK, run_index=run_index, metrics=metrics)


VARIANTS = {
    "thread a call, torch tensors": (lambda: thread_a_call_reward(30.0), torch_experience),
    "kept helpers, torch tensors": (lambda: guarded_reward("math_verify", None, 30.0), torch_experience),
    "kept helpers, numpy tensors": (lambda: guarded_reward("math_verify", None, 30.0), numpy_experience),
    "no time limit, numpy tensors": (lambda: guarded_reward("math_verify", None, 0.0), numpy_experience),
}


def one_round(variant: str, threads: int, samples: int) -> float:
    """Seconds from the moment all ``threads`` have their samples until the last has its experiences."""
    make_reward, make_experience = VARIANTS[variant]
    reward, gens = make_reward(), generations(samples)
    start = threading.Barrier(threads + 1)

    def workflow() -> None:
        start.wait()
        for i, gen in enumerate(gens):
            result = reward(gen.text, TASK.data)
            make_experience(gen, result.reward, i, result.metrics)

    workers = [threading.Thread(target=workflow) for _ in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=32, help="workflow threads (tasks of a step)")
    ap.add_argument("--samples", type=int, default=8, help="samples a task (repeat_times)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for variant in VARIANTS:  # warm-up: imports, the helpers' first start, math_verify's caches
        one_round(variant, args.threads, args.samples)
    for _ in range(args.rounds):
        for variant in VARIANTS:
            times[variant].append(one_round(variant, args.threads, args.samples))
    base = statistics.median(times[next(iter(VARIANTS))])
    lines = [
        f"{args.threads} workflow threads x {args.samples} samples, median of {args.rounds} rounds "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads)",
        "",
        "| variant | ms per step | vs thread a call |",
        "| --- | --- | --- |",
    ]
    for variant, xs in times.items():
        med = statistics.median(xs)
        lines.append(f"| {variant} | {1000 * med:.1f} | {med / base:.2f}x |")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "helper_calls.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
