"""One decode step of a Llama-family causal LM (one new token per row), without transformers' per-call machinery.

The rollout engine decodes one token per row per step, ~100 steps a call. Through the model's own
``forward``, each step pays for transformers' generic machinery: output-capture decorators, the attention
mask built by ``masking_utils`` from the 2-D padding mask, the attention-interface lookup, cache-dispatch
and output dataclasses; and, on CPU, ``scaled_dot_product_attention``'s flash kernel, which for one query
over a bf16 cache took 1.9 ms a layer at 48 keys and 4.5 ms at 128, where two matrix products take 0.5 and
1.1 ms (2-core EPYC with AVX-512-BF16, 64 rows, 8 heads over 4 key heads; in fp32 the two are equal).

``DecodeStep`` runs the same computation from the same modules: the model's own embedding, norms,
projections (biases, LoRA layers and hooks included: each is called, not re-implemented), rotary
embedding and ``apply_rotary_pos_emb`` of its modeling file, and its MLP; what it replaces is the glue
between them and the attention over the cache: ``q @ K^T``, a float32 softmax with the padding mask, ``@ V``,
the arithmetic of transformers' eager attention, grouped-query heads without copying keys. The prefill
(many tokens a row, once a call) still runs through the model's ``forward``; the decode step writes into
the same ``DynamicCache`` layers, so compaction and in-flight reloads are unchanged.

It is taken only where every one of these holds (``DecodeStep.for_model`` says which does not, and the
engine then keeps the model's forward): a ``llama``, ``qwen2`` or ``qwen3`` model with the standard
module layout, full attention in every layer (no sliding window), no attention-logit soft-capping.
Tests: ``tests/models/test_decode_step.py`` holds its logits against the model's forward, step by step
across compaction, for each family, in float32 and bfloat16.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.cache_utils import DynamicCache

__all__ = ["DecodeStep"]

FAMILIES = ("llama", "qwen2", "qwen3")
_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")


class DecodeStep:
    """Next-token logits ``[rows, vocab]`` for one new token per row, the cache updated in place."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.inner = model.model
        self.layers = list(self.inner.layers)
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.qk_norm = hasattr(first, "q_norm")  # qwen3: RMSNorm over each head's query and key
        self.apply_rotary = sys.modules[type(first).__module__].apply_rotary_pos_emb

    @classmethod
    def for_model(cls, model: PreTrainedModel) -> tuple[DecodeStep | None, str]:
        """The decode step for ``model`` and ``""``, or None and why the model's own forward is kept."""
        config = model.config
        family = getattr(config, "model_type", None)
        if family not in FAMILIES:
            return None, f"model_type {family!r} is not one of {', '.join(FAMILIES)}"
        inner = getattr(model, "model", None)
        parts = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
            return None, f"{type(model).__name__} has not the model.{{{', '.join(parts)}}} + lm_head layout"
        for i, layer in enumerate(inner.layers):
            attn = getattr(layer, "self_attn", None)
            if not all(hasattr(layer, p) for p in _LAYER_PARTS) or not all(
                hasattr(attn, p) for p in _ATTN_PARTS
            ):
                return None, f"layer {i} ({type(layer).__name__}) has not the standard module layout"
            if getattr(attn, "sliding_window", None) is not None:
                return None, f"layer {i} attends through a sliding window"
        layer_types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            return None, f"layer_types {sorted(set(layer_types))} are not all full_attention"
        if getattr(config, "attn_logit_softcapping", None):
            return None, "the attention logits are soft-capped"
        return cls(model), ""

    def __call__(
        self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """``tokens [R]`` at ``positions [R]``; ``attention [R, L]`` is 1 on the keys each row attends to
        (its prompt and response so far, this token included: L is the cache's length after the step)."""
        x = self.inner.embed_tokens(tokens[:, None])
        cos, sin = self.inner.rotary_emb(x, positions[:, None])
        rows = x.shape[0]
        # Additive mask [R, 1, 1, L]: 0 where attended, the dtype's lowest value on left padding. Every row
        # attends to at least its new token, so no row's softmax is all -inf.
        mask = torch.zeros(attention.shape, dtype=torch.float32, device=x.device)
        mask.masked_fill_(attention == 0, torch.finfo(torch.float32).min)
        mask = mask[:, None, None, :]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(rows, 1, -1, self.head_dim)
            k = attn.k_proj(h).view(rows, 1, -1, self.head_dim)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            v = attn.v_proj(h).view(rows, 1, -1, self.head_dim).transpose(1, 2)
            keys, values = cache.layers[i].update(k, v)  # [R, kv_heads, L, head_dim]
            out = _attend(q, keys, values, mask, self.scaling)
            x = x + attn.o_proj(out.reshape(rows, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(self.inner.norm(x))[:, -1]


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scaling: float):
    """One query a row over the cache: ``q [R, H, 1, d]``, ``keys``/``values [R, KV, L, d]``, ``mask
    [R, 1, 1, L]`` additive; returns ``[R, H, d]``. With ``G = H / KV``, query heads ``g * G .. (g + 1) * G - 1``
    share key head ``g`` (transformers' ``repeat_kv`` order), so the queries are viewed ``[R, KV, G, d]`` and
    multiply the keys without repeating them. Scores and softmax in float32, as transformers' eager
    attention does."""
    rows, heads, _, dim = q.shape
    kv_heads = keys.shape[1]
    dtype = values.dtype
    if keys.device.type == "cpu" and dtype != torch.float32:
        # On CPU a 16-bit batched product runs through oneDNN, which builds (and caches, up to 1,024) a
        # kernel for every shape, ~0.65 MB each, and the key length grows by one each step: a bf16 engine's
        # resident memory grew from 0.95 to 1.84 GB over 8 calls of 16 rows x 1k tokens at 25M, and on (the
        # freed kernels leave the heap fragmented). In float32 the products go to the BLAS, which keeps
        # nothing (0.60 GB, flat): the cache is read once to convert it, and the step was no slower
        # (tests/models/test_decode_step.py holds the memory; docs/performance.md has the figures).
        q, keys, values = q.float(), keys.float(), values.float()
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float()  # [R, KV, H / KV, L]
    probs = (scores * scaling + mask).softmax(dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(rows, heads, dim).to(dtype)
