from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trivium.models.tiny import make_tiny


def test_loads_through_auto_classes(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok) <= 384
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|end|>"
    assert model.config.pad_token_id == tok.pad_token_id == model.generation_config.pad_token_id
    assert model.config.eos_token_id == tok.eos_token_id == model.generation_config.eos_token_id
    ids = tok("Tom has 12 pens.", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_chat_template_renders_roles_and_generation_prompt(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == "<|system|>\nBe brief.\n<|user|>\n2+2?\n<|assistant|>\n4<|end|>\n"
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|user|>\n2+2?\n<|assistant|>\n")
    ids = tok(prompt)["input_ids"]
    specials = [t for t in ids if t in tok.all_special_ids]
    assert tok.convert_ids_to_tokens(specials) == ["<|system|>", "<|user|>", "<|assistant|>"]


def test_digits_are_single_tokens(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    pieces = tok.tokenize("x 12345 and 907")
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("12345907")
    assert tok.decode(tok("Sam has 120 eggs.\n#### 7")["input_ids"]) == "Sam has 120 eggs.\n#### 7"


def test_deterministic_by_seed(tmp_path: Path, corpus: list[str], tiny_kwargs: dict) -> None:
    a = make_tiny(tmp_path / "a", corpus, seed=3, **tiny_kwargs)
    b = make_tiny(tmp_path / "b", corpus, seed=3, **tiny_kwargs)
    c = make_tiny(tmp_path / "c", corpus, seed=4, **tiny_kwargs)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_leaves_global_rng_alone(tmp_path: Path, corpus: list[str], tiny_kwargs: dict) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_tiny(tmp_path / "m", corpus[:50], seed=0, **tiny_kwargs)
    assert torch.equal(torch.rand(3), expected)


def test_llama_architecture(tmp_path: Path, corpus: list[str], tiny_kwargs: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = make_tiny(tmp_path / "llama", corpus, architecture="llama", seed=0, **tiny_kwargs)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tok)
    assert tok.tokenize("42") == ["4", "2"]
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)[
        "input_ids"
    ]
    assert model(input_ids=torch.tensor([ids])).logits.shape[-1] == len(tok)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_heads": 3}, "divisible"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"architecture": "gpt2"}, "architecture"),
    ],
)
def test_bad_arguments_raise(
    tmp_path: Path, corpus: list[str], tiny_kwargs: dict, kwargs: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        make_tiny(tmp_path / "x", corpus[:20], **{**tiny_kwargs, **kwargs})


def test_empty_corpus_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="corpus"):
        make_tiny(tmp_path / "x", [])
