"""Read a quickstart run's metrics.jsonl and check that GRPO lifted eval accuracy over the SFT model.

    python benchmarks/check_quickstart.py runs/quickstart/word-problems --min-gain 0.30

Prints the eval-accuracy curve and exits non-zero when the gain is below --min-gain.
"""

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--min-gain", type=float, default=0.30)
    ap.add_argument("--key", default="eval/test/accuracy")
    args = ap.parse_args()
    rows = [
        json.loads(x) for x in (Path(args.run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()
    ]
    curve = [(r["stage"], r["global_step"], r[args.key], r.get("time")) for r in rows if args.key in r]
    for stage, step, acc, t in curve:
        print(f"{stage:>6} global_step {step:4d}  {args.key} {acc:.3f}  t={t}s")
    sft = [acc for stage, _, acc, _ in curve if stage == "sft"]
    rl = [acc for stage, _, acc, _ in curve if stage != "sft"]
    if not sft or not rl:
        print("missing eval points for the SFT stage or the RL stage", file=sys.stderr)
        return 1
    start, end = sft[-1], rl[-1]
    print(
        f"SFT model {start:.3f} -> end of RL {end:.3f}: gain {end - start:+.3f} (required {args.min_gain:+.3f})"
    )
    print(f"wall time: {rows[-1].get('time')} s")
    return 0 if end - start >= args.min_gain else 1


if __name__ == "__main__":
    sys.exit(main())
