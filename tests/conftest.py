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
