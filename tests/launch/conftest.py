"""The tiny task of the end-to-end tests: eight code words, a digit each, a half-wrong SFT teacher.

The task: each prompt names one of eight words; the right answer is a digit fixed per word. The SFT
demonstrations come from a teacher that writes the wrong digit for half the rows, so the SFT model is
right about half the time; the exact-answer reward then lets GRPO find the right digit for each word.
"""

import json
import random

import pytest

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle"]


def write_task(folder, seed=0):
    rng = random.Random(seed)
    right = {w: rng.randrange(10) for w in WORDS}
    wrong = {w: (right[w] + 1 + rng.randrange(9)) % 10 for w in WORDS}
    rows = lambda n: [rng.choice(WORDS) for _ in range(n)]  # noqa: E731
    task = [{"question": f"Code for {w}?", "answer": f"#### {right[w]}"} for w in rows(256)]
    # exactly half of each word's demonstrations are wrong
    sft = [
        {"question": f"Code for {w}?", "answer": f"#### {(right if (i // 8) % 2 else wrong)[w]}"}
        for i, w in enumerate(WORDS * 64)
    ]
    rng.shuffle(sft)
    for name, data in (("train", task), ("test", task[:64]), ("sft", sft)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))


def config(folder, grpo_steps=40):
    return {
        "project": "e2e",
        "name": "codes",
        "checkpoint_root": str(folder / "runs"),
        "model": {
            "tiny": {
                "corpus": ["train.jsonl", "sft.jsonl"],
                "hidden_size": 64,
                "num_layers": 2,
                "num_heads": 2,
                "num_kv_heads": 1,
                "intermediate_size": 128,
                "vocab_size": 300,
            }
        },
        "explorer": {"rollout": {"max_tokens": 8}, "eval_interval": 0},
        "buffer": {"eval_tasksets": [{"path": "test.jsonl", "name": "test"}]},
        "monitor": {"progress_bar": False},
        "stages": [
            {
                "name": "sft",
                "mode": "train",
                "algorithm": {"algorithm_type": "sft"},
                "buffer": {
                    "batch_size": 32,
                    "total_steps": 150,
                    "sft_dataset": {
                        "path": "sft.jsonl",
                        "fields": {"prompt": "question", "response": "answer"},
                    },
                },
                "trainer": {"lr": 3e-3, "warmup_steps": 5},
                "explorer": {"eval_at_start": False},
            },
            {
                "name": "grpo",
                "mode": "both",
                "buffer": {
                    "batch_size": 8,
                    "total_steps": grpo_steps,
                    "taskset": {"path": "train.jsonl", "repeat_times": 8},
                },
                "trainer": {"lr": 1e-3},
                "explorer": {"eval_at_start": False},
            },
        ],
    }


@pytest.fixture
def e2e():
    """``write_task(folder, seed)`` and ``config(folder, grpo_steps)`` of the tiny task."""

    class Task:
        write = staticmethod(write_task)
        config = staticmethod(config)

    return Task
