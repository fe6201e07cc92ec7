"""benchmarks/ladder.py: its tokenizer is a real byte-level BPE of exactly the rung's vocabulary, and its
--quick ladder (a 152k vocabulary on a small model) runs both frameworks, the doctor and the floors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_the_ladders_tokenizer_has_the_vocabulary_asked_and_decodes_every_id(tmp_path):
    from ladder_parts import build_tokenizer, make_model, make_prompts
    from transformers import AutoTokenizer

    tok = build_tokenizer(151_936, 8192)
    assert len(tok) == 151_936
    assert tok.decode([1000, 150_000, 151_935])  # every id is text: a random model's samples are readable
    model = make_model("ci-152k", tmp_path / "m")  # saved and loaded back tokenising the same (round trip)
    assert len(AutoTokenizer.from_pretrained(model)) == 151_936
    rows = make_prompts(model, 300, 3, tmp_path / "p.jsonl").read_text().splitlines()
    loaded = AutoTokenizer.from_pretrained(model)
    for row in rows:
        chat = [{"role": "user", "content": json.loads(row)["question"]}]
        text = loaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert abs(len(loaded(text, add_special_tokens=False)["input_ids"]) - 300) <= 2


@pytest.mark.integration
@pytest.mark.slow
def test_the_quick_ladder_measures_both_frameworks_and_the_doctor(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "ladder"
    cmd = [sys.executable, str(REPO / "benchmarks" / "ladder.py"), "--quick", "--work", str(tmp_path / "w")]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    assert [r["rung"] for r in results] == ["ci-152k@256"]
    for r in results:
        for side in ("trl", "trivium"):
            x = r[side]
            assert "failed" not in x, (r["rung"], side, x)
            assert x["s_step"] > 0 and x["tokens_per_step"] > 0 and x["floor_train_s"] > 0
        # the doctor's estimate holds against the measured peak (tests/launch/peak_rss.py)
        assert 0.8 <= r["doctor_mib"] / r["measured_mib"] <= 1.25, r
    assert "| ci-152k@256 |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").stat().st_size
