"""Write the agent examples' data (calculator and FrozenLake) into ./data; deterministic for a seed.

python examples/agents/make_data.py
"""

import argparse
from pathlib import Path

from trivium.tasks.agent_tasks import write_calculator, write_frozenlake

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, write in (("calculator", write_calculator), ("frozenlake", write_frozenlake)):
        paths = write(Path(args.out) / name, seed=args.seed)
        print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in paths.items()))
