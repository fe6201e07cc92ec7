"""Offline readers keep each row's token ids after its first encoding (buffer/offline.py ``EncodedRows``):
later epochs give the same experiences and pairs without rendering the chat template again, within a token
budget, and a new tokenizer forgets what the old one encoded."""

import json

import pytest
import torch

from trivium.buffer import offline
from trivium.buffer.offline import EncodedRows, PreferenceReader, SftReader
from trivium.config.schema import PreferenceDatasetConfig, SftDatasetConfig
from trivium.models.loading import load_tokenizer

ROWS = [
    {
        "prompt": f"Ann has {i} apples. She eats 1. How many are left?",
        "response": f"{i}-1={i - 1}\n#### {i - 1}",
    }
    for i in range(2, 12)
]
PAIRS = [
    {"prompt": f"What is {i} plus 1?", "chosen": f"#### {i + 1}", "rejected": f"#### {i - 1}"}
    for i in range(6)
]


@pytest.fixture
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture
def renders(monkeypatch):
    """How many times the readers rendered a prompt through the chat template."""
    calls = []
    real = offline._prompt_ids
    monkeypatch.setattr(offline, "_prompt_ids", lambda *a: calls.append(1) or real(*a))
    return calls


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def same_experience(a, b):
    assert torch.equal(a.tokens, b.tokens) and a.tokens.dtype == b.tokens.dtype == torch.long
    assert torch.equal(a.action_mask, b.action_mask) and a.action_mask.dtype == torch.bool
    assert (a.prompt_length, a.task_id, a.logprobs.shape) == (b.prompt_length, b.task_id, b.logprobs.shape)


def test_a_second_epoch_of_sft_rows_renders_nothing_and_gives_the_same_experiences(
    tmp_path, tokenizer, renders
):
    cfg = SftDatasetConfig(path=write_jsonl(tmp_path / "sft.jsonl", ROWS), shuffle=False)
    reader = SftReader(cfg, tokenizer)
    first = reader.next_batch(len(ROWS))
    assert len(renders) == len(ROWS) and len(reader.encoded) == len(ROWS)
    again = reader.next_batch(len(ROWS))  # the second epoch, from the kept ids
    assert len(renders) == len(ROWS)
    for a, b in zip(first, again):
        same_experience(a, b)
        assert a.tokens.data_ptr() != b.tokens.data_ptr()  # new tensors: a consumer may change its own
    fresh = SftReader(cfg, tokenizer).next_batch(len(ROWS))  # what encoding gives, for the kept rows too
    for a, b in zip(fresh, again):
        same_experience(a, b)


def test_rows_past_the_token_budget_are_encoded_each_time_and_stay_right(tmp_path, tokenizer, renders):
    cfg = SftDatasetConfig(path=write_jsonl(tmp_path / "sft.jsonl", ROWS), shuffle=False)
    reader = SftReader(cfg, tokenizer)
    row_tokens = len(reader.next_batch(1)[0].tokens)
    reader = SftReader(cfg, tokenizer)
    reader.encoded = EncodedRows(max_tokens=3 * row_tokens + 2)  # room for about three rows
    first = reader.next_batch(len(ROWS))
    kept = len(reader.encoded)
    assert 1 <= kept < len(ROWS) and reader.encoded.tokens <= reader.encoded.max_tokens
    renders.clear()
    again = reader.next_batch(len(ROWS))
    assert len(renders) == len(ROWS) - kept
    for a, b in zip(first, again):
        same_experience(a, b)


def test_a_new_tokenizer_forgets_the_kept_rows(tmp_path, tokenizer, tiny_model_dir, renders):
    cfg = SftDatasetConfig(path=write_jsonl(tmp_path / "sft.jsonl", ROWS), shuffle=False)
    reader = SftReader(cfg, tokenizer)
    reader.next_batch(len(ROWS))
    reader.tokenizer = load_tokenizer(str(tiny_model_dir))  # as dataset_stage sets the run's tokenizer
    reader.next_batch(len(ROWS))
    assert len(renders) == 2 * len(ROWS)


def test_preference_pairs_are_kept_too(tmp_path, tokenizer, renders):
    cfg = PreferenceDatasetConfig(path=write_jsonl(tmp_path / "p.jsonl", PAIRS), shuffle=False)
    reader = PreferenceReader(cfg, tokenizer)
    first = reader.next_batch(len(PAIRS))
    again = reader.next_batch(len(PAIRS))
    assert len(renders) == len(PAIRS)
    for a, b in zip(first, again):
        for part in ("prompt", "chosen", "rejected"):
            x, y = getattr(a, part), getattr(b, part)
            assert torch.equal(x, y) and x.dtype == y.dtype == torch.long, part
        assert a.pair_id == b.pair_id
        assert int(a.chosen[-1]) == tokenizer.eos_token_id
