"""Does the FrozenLake agent read its pictures? examples/vision/frozenlake.yaml over seeds, against two
policies that need no learning, on the same held-out maps.

    python benchmarks/vision_frozenlake.py                     # seeds 0 1 2 (~20 min a seed on 2 cores)
    python benchmarks/vision_frozenlake.py --seeds 0 --baselines-only

For each seed it runs ``trivium run --config examples/vision/frozenlake.yaml --set seed=N`` (the data from
examples/vision/make_data.py), keeps the metrics as benchmarks/results/vision_frozenlake_seedN.metrics.jsonl
and prints greedy success on the held-out maps after SFT and after GRPO. The two reference policies, played
on the same maps (reaching the goal within the episode's 8 moves):

- blind: the best fixed sequence of moves (the same for every map, searched over all of them): what an agent
  that never looks at its pictures can reach;
- local: right if that cell is ice or the goal, else down, else left, else up (every move read from the
  3 x 3 cells around the player): what reading the local view alone gives.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vision"
MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def walk(desc: list[str], moves) -> bool:
    """Whether ``moves`` from S reach G before a hole (a move into the edge stays put, as in gymnasium)."""
    r = c = 0
    for m in moves:
        r = min(max(r + MOVES[m][0], 0), len(desc) - 1)
        c = min(max(c + MOVES[m][1], 0), len(desc[0]) - 1)
        if desc[r][c] in "HG":
            return desc[r][c] == "G"
    return False


def blind(maps: list[list[str]], turns: int) -> tuple[float, str]:
    """The best fixed move sequence of ``turns`` moves over ``maps`` (exhaustive: 4**turns sequences)."""
    best = max(
        (sum(walk(d, seq) for d in maps), seq)
        for seq in itertools.product(("right", "down", "left", "up"), repeat=turns)
    )
    return best[0] / len(maps), " ".join(best[1])


def local(maps: list[list[str]], turns: int) -> float:
    """Success of the local-view policy (module docstring)."""

    def play(desc):
        r = c = 0
        for _ in range(turns):
            for m in ("right", "down", "left", "up"):
                nr, nc = r + MOVES[m][0], c + MOVES[m][1]
                if 0 <= nr < len(desc) and 0 <= nc < len(desc[0]) and desc[nr][nc] != "H":
                    r, c = nr, nc
                    break
            if desc[r][c] == "G":
                return True
        return False

    return sum(play(d) for d in maps) / len(maps)


def run_seed(seed: int, config: Path) -> dict:
    run = f"frozenlake_seed{seed}"
    cmd = [sys.executable, "-m", "trivium.cli", "run", "--config", str(config), "--overwrite"]
    cmd += ["--set", f"seed={seed}", "--set", f"name={run}", "--set", "monitor.progress_bar=false"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, env=os.environ)
    seconds = time.perf_counter() - t0
    run_dir = ROOT / "runs" / "vision" / run
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keep = ROOT / "benchmarks" / "results" / f"vision_frozenlake_seed{seed}.metrics.jsonl"
    keep.write_text("".join(json.dumps(r) + "\n" for r in rows))
    success = [(r["stage"], r["eval/test/success"]) for r in rows if "eval/test/success" in r]
    return {
        "seed": seed,
        "sft": [v for s, v in success if s == "sft"][-1],
        "grpo": [v for s, v in success if s == "grpo"],
        "seconds": seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", type=Path, default=EXAMPLE / "frozenlake.yaml")
    ap.add_argument("--baselines-only", action="store_true", help="print the reference policies only")
    args = ap.parse_args()
    from trivium.envs.frozenlake import map_from_row

    data = EXAMPLE / "data" / "frozenlake"
    if not (data / "test.jsonl").exists():
        subprocess.run([sys.executable, str(EXAMPLE / "make_data.py")], check=True)
    maps = [map_from_row(json.loads(x)) for x in (data / "test.jsonl").read_text().splitlines() if x.strip()]
    score, moves = blind(maps, 6)
    print(
        f"{len(maps)} held-out maps: best blind sequence ({moves}) {score:.3f}; local view policy {local(maps, 8):.3f}"
    )
    if args.baselines_only:
        return 0
    for seed in args.seeds:
        r = run_seed(seed, args.config)
        print(
            f"seed {seed}: after SFT {r['sft']:.3f} -> after GRPO {r['grpo'][-1]:.3f} "
            f"(evals {', '.join(f'{v:.3f}' for v in r['grpo'])}), {r['seconds']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
