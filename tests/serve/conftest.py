"""A tiny local model for the serve/ tests, built once per session, and helpers to check what the server says."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

TINY_KWARGS = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
}


def agent_corpus(n: int = 200, seed: int = 0) -> list[str]:
    """Word problems, chat turns and tool calls, so the tokenizer has merges for what agents send."""
    rng = random.Random(seed)
    names, items = ["Tom", "Ann", "Sam", "Mia"], ["apples", "pens", "coins", "cards"]
    out = []
    for _ in range(n):
        name, item, a, b = rng.choice(names), rng.choice(items), rng.randint(2, 99), rng.randint(1, 9)
        out.append(f"{name} has {a} {item} and gets {b} more. How many {item} now?")
        args = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} + {b}"}})
        out.append(f"<tool_call>\n{args}\n</tool_call>")
        out.append(f"<tool_response>\n{a + b}\n</tool_response>\n#### {a + b}")
    return out


@pytest.fixture(scope="session")
def serve_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trivium.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("serve") / "tiny", agent_corpus(), seed=0, **TINY_KWARGS)


@pytest.fixture(scope="session")
def tokenizer(serve_model_dir: Path):
    from trivium.models.loading import load_tokenizer

    return load_tokenizer(serve_model_dir)


@pytest.fixture(scope="module")
def engine(serve_model_dir: Path):
    from trivium.models.transformers_engine import TransformersEngine

    return TransformersEngine.from_pretrained(serve_model_dir, seed=0)


@pytest.fixture(scope="session")
def calculator() -> dict:
    """An OpenAI ``tools`` entry."""
    return json.loads(json.dumps(CALCULATOR))


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def http(method: str, url: str, body: Any = None, key: str | None = None) -> tuple[int, dict]:
    """A raw request (no OpenAI client): ``(status, JSON body)``; ``body`` bytes are sent as they are."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def teacher_forced_logprobs(
    engine, prompt: list[int], response: list[int], temperature: float = 1.0
) -> list[float]:
    """log_softmax(logits / T) of each response token in one fp32 forward pass over prompt + response."""
    import torch

    ids = torch.tensor([list(prompt) + list(response)])
    with torch.inference_mode():
        logits = engine.model(input_ids=ids).logits.float()[0]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    targets = torch.tensor(response)
    return logp[len(prompt) - 1 : -1].gather(1, targets[:, None]).squeeze(1).tolist()


@pytest.fixture(scope="session")
def raw_http():
    """``raw_http(method, url, body=None, key=None) -> (status, json)``: requests without the OpenAI client."""
    return http


@pytest.fixture(scope="session")
def teacher_forced():
    """``teacher_forced(engine, prompt, response, temperature) -> list[float]``: the trainer's log-probs."""
    return teacher_forced_logprobs
