"""The trainer tests' tiny policy and its tokenizer."""

import pytest
import torch
from transformers import AutoModelForCausalLM


@pytest.fixture
def policy(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.fixture
def tokenizer(tiny_model_dir):
    from trivium.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)
