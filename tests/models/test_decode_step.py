"""``DecodeStep`` against the model's own forward: the same next-token logits, step by step, per family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.cache_utils import DynamicCache

from trivium.models.decode_step import DecodeStep
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import ReservedLayer, TransformersEngine

SHAPE = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def build(family: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))  # q/k/v biases
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32))  # q/k norms, head_dim != hidden / heads
    else:  # llama with biases everywhere and a scaled rotary embedding
        config = LlamaConfig(
            **SHAPE, attention_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0}
        )
        model = LlamaForCausalLM(config)
    for p in model.parameters():  # larger than the init's 0.02, so that mistakes show in the logits
        p.data.normal_(0, 0.2)
    return model.to(dtype).eval()


def decode_both(model: torch.nn.Module, steps: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Prefill 4 left-padded rows once, then decode ``steps`` greedy tokens twice from copies of that cache:
    through the model's forward and through ``DecodeStep``; rows 1 and 2 leave the batch after step 2 (the
    engine's compaction). Returns each step's (forward logits, DecodeStep logits)."""
    step, why = DecodeStep.for_model(model)
    assert step is not None, why
    lengths = [5, 9, 7, 3]
    width = max(lengths)
    ids = torch.randint(1, 97, (4, width), generator=torch.Generator().manual_seed(1))
    attention = torch.zeros(4, width, dtype=torch.long)
    for r, n in enumerate(lengths):
        attention[r, width - n :] = 1
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    caches, logits = [], None
    with torch.inference_mode():
        for _ in range(2):
            cache = DynamicCache(config=model.config)
            cache.layers = [ReservedLayer(width + 2, width + steps) for _ in cache.layers]  # grows once
            out = model(
                input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True
            )
            caches.append(cache)
            logits = out.logits[:, -1]
        pairs = []
        tokens, pos = logits.argmax(-1), positions[:, -1] + 1
        for s in range(steps):
            if s == 2:
                keep = torch.tensor([0, 3])
                for cache in caches:
                    cache.batch_select_indices(keep)
                tokens, pos, attention = tokens[keep], pos[keep], attention[keep]
            attention = torch.cat([attention, attention.new_ones(len(tokens), 1)], dim=1)
            reference = model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=pos[:, None],
                cache=caches[0],
                use_cache=True,
            ).logits[:, -1]
            mine = step(tokens, attention, pos, caches[1])
            pairs.append((reference.float(), mine.float()))
            tokens, pos = reference.argmax(-1), pos + 1
    return pairs


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_decode_step_equals_the_model_forward_in_fp32(family: str) -> None:
    for reference, mine in decode_both(build(family)):
        assert mine.shape == reference.shape
        torch.testing.assert_close(mine, reference, atol=2e-5, rtol=1e-5)


def test_decode_step_stays_within_bf16_rounding_of_the_forward() -> None:
    """In bf16 both paths round differently (the forward's flash attention keeps its sums in float32 inside
    one kernel; the decode step attends over a float32 copy of the cache on CPU and rounds its output to
    bf16); the gap stays at the size of bf16's rounding, far below what a mistake (a wrong head, a position
    off by one) makes."""
    pairs = decode_both(build("qwen2", torch.bfloat16))
    scale = max(reference.abs().max().item() for reference, _ in pairs)
    gap = max((mine - reference).abs().max().item() for reference, mine in pairs)
    assert gap <= 0.03 * scale, (gap, scale)


def test_bf16_attention_over_the_cache_is_computed_in_float32_on_cpu() -> None:
    """The products over a 16-bit cache run in float32 on CPU (``_attend``): exactly the float32 computation
    on the same values, rounded to bf16 once at the end."""
    from trivium.models.decode_step import _attend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((3, 4, 1, 8), (3, 2, 11, 8), (3, 2, 11, 8)))
    mask = torch.zeros(3, 1, 1, 11)
    mask[0, ..., :4] = torch.finfo(torch.float32).min  # left padding of row 0
    low = [x.to(torch.bfloat16) for x in (q, k, v)]
    got = _attend(*low, mask, 0.35)
    assert got.dtype == torch.bfloat16
    want = _attend(*(x.float() for x in low), mask, 0.35).to(torch.bfloat16)
    assert torch.equal(got, want)


MEMORY_WORKER = """
import sys, torch
sys.path.insert(0, {root!r})
from tests.launch.peak_rss import rss_mb
from trivium.models.decode_step import _attend
torch.set_num_threads(1)
q, mask = torch.randn(16, 8, 1, 64, dtype=torch.bfloat16), torch.zeros(16, 1, 1, 1024)
def steps(lengths):
    for n in lengths:
        k = torch.randn(16, 4, n, 64, dtype=torch.bfloat16)
        _attend(q, k, k, mask[..., :n], 0.125)
steps(range(64, 96))  # warm-up: the allocator's and the libraries' first pages
before = rss_mb()
steps(range(96, 608))
print(rss_mb() - before)
"""


def test_bf16_decode_attention_keeps_no_memory_per_key_length() -> None:
    """A decode step's key length grows by one each step. On CPU, 16-bit batched products go through oneDNN,
    which builds and keeps a kernel for every shape (~0.65 MB each, up to 1,024, and the heap fragmented past
    that): 512 key lengths grew a process by ~540 MB that way. In float32 (``_attend`` on CPU) nothing is kept.
    Measured in a fresh process (glibc serving large blocks by mmap, as tests/launch/peak_rss.py does)."""
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_WORKER.format(root=root)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    grown_mb = float(out.stdout.strip().splitlines()[-1])
    assert grown_mb < 48, f"512 decode steps of growing length kept {grown_mb:.0f} MB"


def test_models_outside_the_families_keep_their_forward() -> None:
    sliding = Qwen2ForCausalLM(
        Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    )
    step, why = DecodeStep.for_model(sliding)
    assert step is None and "sliding window" in why
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    step, why = DecodeStep.for_model(gpt2)
    assert step is None and "'gpt2'" in why


def test_engine_samples_the_same_through_decode_step_and_forward(
    tiny_dir: Path, prompts: list[list[int]]
) -> None:
    """The same seed gives the same tokens and log-probs (1e-5) either way, rows finishing at different steps."""
    fast = TransformersEngine.from_pretrained(tiny_dir, device="cpu", dtype="float32", seed=3)
    slow = TransformersEngine.from_pretrained(tiny_dir, device="cpu", dtype="float32", seed=3)
    assert fast.decode_step is not None  # the tiny models are qwen2
    slow.decode_step = None
    params = SamplingParams(n=4, max_tokens=24, temperature=1.0)
    for a, b in zip(fast.generate(prompts, params), slow.generate(prompts, params)):
        for ga, gb in zip(a, b):
            assert ga.response_ids == gb.response_ids
            torch.testing.assert_close(
                torch.tensor(ga.logprobs), torch.tensor(gb.logprobs), atol=1e-5, rtol=0
            )
