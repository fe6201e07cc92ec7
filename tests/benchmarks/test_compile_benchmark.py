"""benchmarks/compile.py's table: ratios to the eager run of the same precision and the compile's payback."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_table_compares_each_compiled_run_with_its_own_precisions_eager_run():
    spec = importlib.util.spec_from_file_location("compile_benchmark", REPO / "benchmarks" / "compile.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def row(precision, compiled, first, step, layers=8):
        return {"shape": "25M", "precision_asked": precision, "precision": precision, "compile": compiled,
                "first_s": first, "s_per_step": step, "compiled_layers": layers if compiled else 0}  # fmt: skip

    lines = bench.table(
        [
            row("fp32", False, 2.0, 1.0),
            row("fp32", True, 62.0, 0.8),  # 60 s more, 0.2 s a step less: 300 steps
            row("bf16", False, 1.0, 0.5),
            row("bf16", True, 40.0, 0.6),
            row("bf16", True, 1.0, 0.5, layers=0),
        ]
    ).splitlines()
    assert lines[3].endswith("| 0.800 | 0.80x | 300 steps |")
    assert lines[5].endswith("| 0.600 | 1.20x | never (no faster) |")
    assert lines[6].endswith("| not compiled (bf16 emulation) |")
