"""Regenerate the vision example's data (deterministic: the same seed gives byte-identical files).

    python examples/vision/make_data.py

train.jsonl: 2000 boards asking which colour has the most shapes, with the gold answer (the RL task set)
test.jsonl:  256 held-out boards (eval)
sft.jsonl:   2000 demonstrations by a "confused teacher" that names the wrong colour for green and blue boards
Each row holds its image as a PNG data URL (trivium/tasks/shapes.py).
"""

from pathlib import Path

from trivium.tasks.shapes import write_shapes

if __name__ == "__main__":
    for name, path in write_shapes(Path(__file__).parent / "data", seed=0, n_train=2000, n_sft=2000).items():
        print(f"{name}: {path}")
