"""Regenerate the countdown example's data (deterministic: the same seed gives byte-identical files).

    python examples/countdown/make_data.py

train.jsonl: 3000 countdown tasks (3 numbers from 1-12, + - *, shown in the order a solution uses them)
test.jsonl:  256 held-out tasks (eval)
sft.jsonl:   3000 demonstrations by a "confused teacher" (trivium.tasks.countdown.CONFUSION)
"""

from pathlib import Path

from trivium.tasks.countdown import write_countdown

SETTINGS = {"n_numbers": 3, "max_number": 12, "ops": "+-*", "max_target": 100, "shuffle": False}

if __name__ == "__main__":
    out = Path(__file__).parent / "data"
    for name, path in write_countdown(out, seed=0, n_train=3000, n_sft=3000, **SETTINGS).items():
        print(f"{name}: {path}")
