"""benchmarks/engines.py's measuring code on a tiny model: the HF generate baseline and the in-process
engine rows report what they claim (log-probs that match a teacher-forced pass, EOS-cut samples, a
weight update), so the figures in the README come from code that is checked."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("engines_benchmark", REPO / "benchmarks" / "engines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("engine", "dtype", "autocast", "max_gap"),
    [
        ("hf", "float32", None, 1e-4),
        ("transformers", "float32", None, 1e-4),
        ("transformers", "bfloat16", None, 1.0),
        ("transformers", "float32", "bfloat16", 1.0),
    ],
)
def test_rows_measure_speed_memory_logprob_gap_and_updates(
    bench, tiny_model_dir, tmp_path, engine, dtype, autocast, max_gap
):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question": f"Tom has {i} apples."}) + "\n" for i in range(20)))
    prompts = bench.prompt_ids(tiny_model_dir, questions)
    assert len(prompts) == bench.N_PROMPTS and all(prompts)
    spec = {
        "model": str(tiny_model_dir),
        "prompts": prompts,
        "engine": engine,
        "dtype": dtype,
        "autocast": autocast,
        "max_tokens": 6,
        "repeats": 2,
    }
    row = bench.run_row(spec)
    assert len(row["walls"]) == 2 and row["wall_s"] > 0
    assert 0 < row["gen_tokens"] <= bench.N_PROMPTS * bench.N_SAMPLES * 6
    assert row["peak_rss_mb"] > 100  # this process at least (torch + model)
    assert row["max_logprob_gap"] < max_gap
    if dtype == "bfloat16" or autocast:
        assert row["max_logprob_gap"] > 1e-5  # lower precision shows
    assert (row["update_s"] is None) == (engine == "hf")
    line = bench.tables([{"workload": "quickstart", "row": "HF generate fp32", **row}])
    assert "**1.00x**" in line
