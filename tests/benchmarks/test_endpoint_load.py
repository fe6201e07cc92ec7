"""benchmarks/endpoint_load.py's measuring code, on a short run: four phases, every request counted, the
server's memory read, no 5xx (the figures in docs/serve.md come from this code)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_load_run(tmp_path):
    spec = importlib.util.spec_from_file_location("endpoint_load", REPO / "benchmarks" / "endpoint_load.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.run(seconds=3, clients=4, work=tmp_path, write=False)
    assert [r["phase"] for r in rows] == [
        "1 client",
        "4 clients",
        "4 + n=64, split_n=8",
        "4 + n=64, not split",
    ]
    assert all(r["requests"] > 0 and r["errors_5xx"] == 0 and r["other_non_200"] == 0 for r in rows)
    assert rows[2]["n64_requests"] >= 1 and rows[2]["p95_vs_busy"] > 0
    assert all(0 < r["rss_mb"] <= r["peak_rss_mb"] for r in rows)
