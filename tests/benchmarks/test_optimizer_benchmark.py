"""benchmarks/optimizer.py times the trainer's own AdamW in every implementation on a ladder shape."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_every_implementation_is_timed_on_the_quickstart_shape():
    spec = importlib.util.spec_from_file_location("optimizer_benchmark", REPO / "benchmarks" / "optimizer.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.time_shape("1M", steps=1, rounds=1)
    assert 0.9 < row["params_m"] < 1.1
    assert set(row["ms"]) == {"for_loop", "foreach", "fused", "bf16 moments"} and all(row["ms"].values())
    assert row["state_mb"]["bf16 moments"] == pytest.approx(row["state_mb"]["fused"] / 2, rel=0.01)
    assert row["vs_for_loop"]["for_loop"] == 1.0
