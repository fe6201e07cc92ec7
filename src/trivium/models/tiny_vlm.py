"""A tiny, fully local vision-language model: ``make_tiny``'s tokenizer with image tokens, a random Qwen2-VL.

The folder is an ordinary Qwen2-VL checkpoint: ``config.json`` (a 2-layer vision tower and M-RoPE text
decoder), ``model.safetensors``, the tokenizer with ``<|vision_start|>``, ``<|image_pad|>`` and
``<|vision_end|>``, a chat template whose messages may hold image parts (``{"type": "image"}``, rendered
as ``<|vision_start|><|image_pad|><|vision_end|>``, as Qwen2-VL's own template does) and the image
processor's ``preprocessor_config.json`` (images resized to ``min_pixels``..``max_pixels``, 14-pixel patches
merged 2 x 2: a 56 x 56 image is 4 visual tokens, a 112 x 112 one 16). Deterministic for a corpus and seed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import torch

from trivium.models.tiny import (
    ASSISTANT,
    CHAT_TEMPLATE,
    SYSTEM,
    USER,
    build_tokenizer,
    check_round_trip,
    text_sizes,
)

__all__ = ["IMAGE_PAD", "VISION_END", "VISION_START", "VLM_CHAT_TEMPLATE", "make_tiny_vlm"]

VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"

# The text template with message contents that may be lists of parts: text parts as their text, image parts
# (and OpenAI-style image_url parts) as one placeholder, which VisionProcessor.expand widens per image.
_RENDER = (
    "{% macro render(c) %}{% if c is string %}{{ c }}{% else %}{% for p in c %}"
    "{% if p['type'] in ('image', 'image_url') %}"
    + VISION_START
    + IMAGE_PAD
    + VISION_END
    + "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endmacro %}"
)
VLM_CHAT_TEMPLATE = _RENDER + CHAT_TEMPLATE.replace(
    "<|user|>\n{{ m['content'] }}", "<|user|>\n{{ render(m['content']) }}"
).replace("<|system|>\n{{ m['content'] }}", "<|system|>\n{{ render(m['content']) }}")
if VLM_CHAT_TEMPLATE.count("render(m[") != 2:  # the text template changed: say so at import, not in a run
    raise RuntimeError("tiny_vlm: CHAT_TEMPLATE's user/system turns changed; update VLM_CHAT_TEMPLATE")


def make_tiny_vlm(
    out_dir: str | Path,
    corpus: Iterable[str],
    *,
    vision_depth: int = 2,
    vision_embed_dim: int = 64,
    vision_heads: int = 4,
    min_pixels: int = 56 * 56,
    max_pixels: int = 112 * 112,
    **sizes: int,
) -> Path:
    """Train a tokenizer on ``corpus``, build a randomly initialised Qwen2-VL and save the folder (model,
    tokenizer, image processor) to ``out_dir``; about 1.3 M parameters with the defaults. ``sizes``: the
    language model's, named and defaulted as ``make_tiny``'s (``hidden_size``, ``num_layers``, ...;
    ``max_position_embeddings`` 1024 here: images take room)."""
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    t = SimpleNamespace(**text_sizes(**{"max_position_embeddings": 1024, **sizes}))
    texts = [line for line in corpus if line]
    if not texts:
        raise ValueError("make_tiny_vlm() needs a non-empty corpus: pass some text that looks like your task")
    head_dim = t.hidden_size // t.num_heads
    if t.hidden_size % t.num_heads or t.num_heads % t.num_kv_heads or head_dim % 4:
        raise ValueError(
            f"make_tiny_vlm(): hidden_size={t.hidden_size} must be divisible by num_heads={t.num_heads} into a head "
            f"size divisible by 4 (M-RoPE splits it three ways), and num_heads by num_kv_heads={t.num_kv_heads}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(texts, t.vocab_size, t.max_position_embeddings)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [SYSTEM, USER, ASSISTANT, VISION_START, IMAGE_PAD, VISION_END]}
    )
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    half = head_dim // 2  # M-RoPE sections (temporal, height, width) of the rotary half, Qwen2-VL's 1:1.5:1.5
    sections = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in (VISION_START, IMAGE_PAD, VISION_END)}
    special = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_layers,
            "num_attention_heads": t.num_heads,
            "num_key_value_heads": t.num_kv_heads,
            "max_position_embeddings": t.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections},
            "tie_word_embeddings": True,
            **special,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_embed_dim,
            "hidden_size": t.hidden_size,
            "num_heads": vision_heads,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=ids[IMAGE_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        **special,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(t.seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(out)
    check_round_trip(out, tokenizer, texts[:256])
    return out
