"""Regenerate the quickstart's data (deterministic: the same seed gives byte-identical files).

    python examples/quickstart/make_data.py

train.jsonl: 4000 word problems with gold GSM8K-style solutions (the RL task set)
test.jsonl:  256 held-out problems (eval)
sft.jsonl:   4000 demonstrations by a "confused teacher" that uses the wrong operation for some verbs
"""

from pathlib import Path

from trivium.tasks.word_problems import write_word_problems

if __name__ == "__main__":
    for name, path in write_word_problems(Path(__file__).parent / "data", seed=0).items():
        print(f"{name}: {path}")
