"""GRPO train steps of a 2-layer model at a real vocabulary, and what they added to resident memory:
``python tests/launch/head_memory_worker.py VOCAB PROMPT RESPONSE ROWS [PRECISION [HEAD_GRAD_PRECISION]]``
prints one JSON line (MiB).

The growth is ``VmHWM`` during the second step minus ``VmRSS`` before the first, with the kernel's mark
reset just before the second (``/proc/self/clear_refs``): AdamW's moments (made at the first step, after its
backward pass) and, beside them, the second step's gradients and the micro-batch's activations, the
vocabulary head's included: what every step after the first holds. Run it with
``MALLOC_MMAP_THRESHOLD_=65536`` (the test does) so that freed tensors leave RSS at once.
"""

import gc
import json
import re
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from trivium.config.schema import AlgorithmConfig, TrainerConfig
from trivium.trainer.spec import AlgorithmSpec
from trivium.trainer.trainer import Trainer
from trivium.types import Experience

SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
SHAPE["intermediate_size"] = 128


def status_mb(field: str) -> float:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(found.group(1)) / 1024


def main(
    vocab: int,
    prompt: int,
    response: int,
    rows: int,
    precision: str = "fp32",
    head_grad_precision: str = "fp32",
) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, tie_word_embeddings=False, **SHAPE))
    trainer = Trainer(
        model,
        TrainerConfig(
            lr=1e-4, micro_batch_size=rows, precision=precision, head_grad_precision=head_grad_precision
        ),
        AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo")),
        pad_token_id=0,
        total_steps=2,
        max_response_length=response,
    )
    g = torch.Generator().manual_seed(1)
    batch = [
        Experience(
            tokens=torch.randint(1, vocab, (prompt + response,), generator=g),
            prompt_length=prompt,
            action_mask=torch.ones(response, dtype=torch.bool),
            logprobs=-torch.rand(response, generator=g),
            reward=float(i % 2),
            group_id=0,
            run_index=i,
        )
        for i in range(rows)
    ]
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = status_mb("VmRSS")
    trainer.train_step(batch)  # the first step makes AdamW's moments, after its backward pass
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    metrics = trainer.train_step(batch)  # a step as every later one: its pass beside the moments
    grown = status_mb("VmHWM") - before
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"grown_mb": grown, "params": params, "loss": float(metrics["train/loss"])}))


if __name__ == "__main__":
    main(*map(int, sys.argv[1:5]), *sys.argv[5:])
