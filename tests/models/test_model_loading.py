from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from trivium.models.loading import load_causal_lm, load_tokenizer, resolve_device, resolve_dtype


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_cuda_without_cuda_says_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"CUDA is not available.*'cpu' or 'auto'"):
        resolve_device("cuda")


def test_resolve_dtype() -> None:
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("float16") is torch.float16
    assert resolve_dtype(torch.bfloat16) is torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    with pytest.raises(ValueError, match=r"'fp33'.*float32"):
        resolve_dtype("fp33")


def test_load_model_and_tokenizer(tiny_dir: Path) -> None:
    tok = load_tokenizer(tiny_dir)
    model = load_causal_lm(tiny_dir, dtype="bfloat16", device="cpu")
    assert tok.pad_token_id is not None
    assert model.dtype is torch.bfloat16 and not model.training
    assert load_causal_lm(str(tiny_dir), dtype=torch.float32).dtype is torch.float32


def test_missing_folder_names_path_and_make_tiny(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for load in (load_tokenizer, lambda p: load_causal_lm(p, dtype="float32", device="cpu")):
        with pytest.raises(FileNotFoundError, match=f"{missing}.*trivium make-tiny"):
            load(missing)
        with pytest.raises(FileNotFoundError, match="trivium make-tiny"):
            load(str(missing))


def test_hub_id_offline_error_suggests_make_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"(?s)no-such-org/no-such-model.*trivium make-tiny"):
        load_tokenizer("no-such-org/no-such-model")


def test_pad_token_falls_back_to_eos(
    tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tok = load_tokenizer(tiny_dir)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token_id == loaded.eos_token_id
    assert "no pad token" in caplog.text
