"""benchmarks/recompute.py's measurement of a rung: both ways to the same losses, with a peak and the
doctor's estimate (the figures, each setting in a process of its own, are in docs/performance.md)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_a_small_rung_trains_both_ways_to_the_same_losses():
    from recompute import one_setting, rung_length

    assert rung_length("25M@4k") == ("25M", 4096) and rung_length("1M@192") == ("1M", 192)
    off, on = (one_setting("1M@192", recompute, rows=2, steps=2) for recompute in (False, True))
    assert off["losses"] == on["losses"] and len(on["losses"]) == 2
    assert on["doctor_mb"] < off["doctor_mb"] and on["peak_mb"] > 0 and on["s_step"] > 0
