import os

import pytest
import torch

# Denormal floats make CPU matmuls crawl as weights shrink during training.
torch.set_flush_denormal(True)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def word_problem_dir(tmp_path_factory):
    """train/test/sft JSONL of the quickstart's word problems, small."""
    from trivium.tasks.word_problems import write_word_problems

    out = tmp_path_factory.mktemp("word_problems")
    write_word_problems(out, seed=0, n_train=64, n_test=16, n_sft=64)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, word_problem_dir):
    """A 2-layer, hidden-64 Qwen2 model with a tokenizer trained on the word problems."""
    from trivium.models.tiny import make_tiny
    from trivium.tasks.word_problems import corpus, generate_rows

    return make_tiny(
        tmp_path_factory.mktemp("tiny") / "model",
        list(corpus(generate_rows(300, seed=0))),
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        seed=0,
    )
