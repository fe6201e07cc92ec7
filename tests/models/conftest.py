"""Tiny local models for the models/ tests, built once per session from a synthetic corpus."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

TINY_KWARGS = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
}


def synthetic_corpus(n: int = 300, seed: int = 0) -> list[str]:
    """Short word problems with numbers, like the tasks the tiny models stand in for."""
    rng = random.Random(seed)
    names, items = ["Tom", "Ann", "Sam", "Mia", "Ben"], ["apples", "pens", "coins", "cards", "eggs"]
    verbs = ["buys", "finds", "sells", "loses", "gets"]
    out = []
    for _ in range(n):
        name, item = rng.choice(names), rng.choice(items)
        a, b = rng.randint(2, 120), rng.randint(1, 9)
        out.append(f"{name} has {a} {item}. {name} {rng.choice(verbs)} {b}. How many {item} now?")
        out.append(f"{a}+{b}={a + b}\n#### {a + b}")
    return out


@pytest.fixture(scope="session")
def tiny_kwargs() -> dict:
    return dict(TINY_KWARGS)


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return synthetic_corpus()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    from trivium.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "qwen2", corpus, seed=0, **TINY_KWARGS)


@pytest.fixture(scope="session")
def other_tiny_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    """Same tokenizer and shapes as ``tiny_dir``, different random weights (seed 1)."""
    from trivium.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "qwen2_seed1", corpus, seed=1, **TINY_KWARGS)


@pytest.fixture(scope="session")
def prompts(tiny_dir: Path, corpus: list[str]) -> list[list[int]]:
    """Chat prompts of different lengths (so batches need left padding)."""
    from trivium.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_dir)
    questions = [corpus[0], "Hi", corpus[2] + " " + corpus[4], "What is 7+5?"]
    return [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
        for q in questions
    ]
