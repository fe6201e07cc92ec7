"""Regenerate the vision example's data (deterministic: the same seed gives byte-identical files).

    python examples/vision/make_data.py

train.jsonl: 2000 boards asking which colour has the most shapes, with the gold answer (the RL task set)
test.jsonl:  256 held-out boards (eval)
sft.jsonl:   2000 demonstrations by a "confused teacher" that names the wrong colour for green and blue boards
Each row holds its image as a PNG data URL (trivium/tasks/shapes.py).

frozenlake/: the FrozenLake agent seen as pictures (frozenlake.yaml): 4x4 map task sets and a confused
teacher's multi-turn demonstrations with every picture (the 3 x 3 cells around the player) as a PNG data
URL (trivium/tasks/agent_tasks.py); about 25 MB, written here and not shipped.
"""

from pathlib import Path

from trivium.tasks.agent_tasks import write_frozenlake
from trivium.tasks.shapes import write_shapes

if __name__ == "__main__":
    data = Path(__file__).parent / "data"
    for name, path in write_shapes(data, seed=0, n_train=2000, n_sft=2000).items():
        print(f"{name}: {path}")
    for name, path in write_frozenlake(
        data / "frozenlake", seed=0, env_args={"observation": "image", "view": 3}
    ).items():
        print(f"frozenlake {name}: {path}")
