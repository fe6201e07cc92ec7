"""Attention for short bf16 sequences on CPU, registered with transformers as ``"trivium"``.

torch's CPU ``scaled_dot_product_attention`` runs bf16 through a flash kernel built for long sequences: at
the lengths of most RL samples it is slower than the plain products it stands for. ``ShortAttention``
against it, causal, forward and backward over ~4k tokens a call on a 2-core AVX-512-BF16 CPU (``python
benchmarks/attention.py``): 0.49x sdpa's time at 128 tokens, 0.61x at 160 and 0.80x at 192 with the 25M
model's 8 / 4 heads (0.50x, 0.54x, 0.83x with Qwen2.5-0.5B's 14 / 2); about even at 256-512; slower beyond
(2.1x at 1k). So it is taken up to ``SHORT_KEYS`` keys. ``ShortAttention`` keeps only its inputs and
recomputes the probabilities in the backward (one more ``Q K^T`` and softmax): no activation memory beyond
sdpa's.

``attention`` takes that path on CPU for bf16 queries (or any under bf16 autocast, where the rotary
embedding hands over float32) up to ``SHORT_KEYS`` keys, without dropout and without the extras some models
add (sliding windows, soft-capping, sinks); everything else goes to transformers' sdpa function unchanged.
The mask is sdpa's (``sdpa_mask``): None means causal, else a boolean ``[rows, 1, queries, keys]``, True
where a query may attend, or an additive one that only masks (0 or -inf / the dtype's lowest, as the
trainer's shared-prompt rows pass it: ``TrainBatch.attention_inputs``). On a CPU without bf16 instructions the products run under ``Bf16MatmulEmulation``,
like every bf16 product of the trainer, so the result does not depend on the CPU. Numerics: the scores are a
bf16 product, as in transformers' eager attention (sdpa's flash kernel keeps them in float32), about twice
sdpa's error against a float64 reference; the softmax is float32 in both. The trainer switches its models to
it when it trains in bf16 on CPU (``Precision.prepare_attention``).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

__all__ = ["SHORT_KEYS", "ShortAttention", "attention", "compute_dtype", "register", "use_short_attention"]

NAME = "trivium"
SHORT_KEYS = 192  # the longest key sequence ShortAttention takes: sdpa's flash kernel is as fast at ~192-256
ROW_VALUES = 1 << 24  # scores per chunk of rows (64 MiB in float32): bounds the forward's transient memory
_EXTRAS = ("sliding_window", "softcap", "s_aux", "position_bias")


class ShortAttention(torch.autograd.Function):
    """``softmax(Q K^T · scale, masked) V``, grouped-query heads viewed, not repeated. The softmax reads the
    scores in float32 and writes the probabilities in the inputs' dtype (as transformers' eager attention
    casts them before ``@ V``). Saves Q, K and V only: the backward recomputes the probabilities.

    ``q`` [B, H, L, D], ``k`` and ``v`` [B, KV, S, D] (H a multiple of KV, heads grouped as transformers'
    ``repeat_kv`` does: query head h reads key head h // (H / KV)); ``keep`` None (causal, the last query
    aligned with the last key) or a boolean [B or 1, 1, L, S], True where a query may attend.
    Returns [B, H, L, D].
    """

    @staticmethod
    @torch.autocast("cpu", enabled=False)
    def forward(ctx, q, k, v, keep, scale: float):
        b, h, n, d = q.shape
        kv = k.shape[1]
        qs = (q * scale).reshape(b, kv, h // kv * n, d)  # [B, KV, G*L, D]: a group's queries in a row
        masked = _masked(keep, b, h // kv, n, k.shape[2], q.device)
        out = torch.empty_like(qs)
        for rows, mask in _row_chunks(qs, k, masked):
            out[rows] = _probs(qs[rows], k[rows], mask) @ v[rows]
        ctx.save_for_backward(qs, k, v, masked)
        ctx.scale, ctx.shape = scale, (b, h, n, d)
        return out.view(b, h, n, d)

    @staticmethod
    @torch.autocast("cpu", enabled=False)
    def backward(ctx, grad_out):
        qs, k, v, masked = ctx.saved_tensors
        dout = grad_out.reshape(qs.shape).to(qs.dtype)
        dq, dk, dv = torch.empty_like(qs), torch.empty_like(k), torch.empty_like(v)
        for rows, mask in _row_chunks(qs, k, masked):
            probs = _probs(qs[rows], k[rows], mask)
            dv[rows] = probs.transpose(-1, -2) @ dout[rows]
            dprobs = dout[rows] @ v[rows].transpose(-1, -2)
            dscores = torch._softmax_backward_data(dprobs, probs, -1, probs.dtype)
            dq[rows] = dscores @ k[rows]
            dk[rows] = dscores.transpose(-1, -2) @ qs[rows]
        return (dq * ctx.scale).view(ctx.shape), dk, dv, None, None


def _masked(keep: torch.Tensor | None, b: int, groups: int, n: int, s: int, device) -> torch.Tensor:
    """Boolean [B or 1, 1, G*L, S], True where a (group-stacked) query may *not* attend."""
    if keep is None:
        queries = torch.arange(n, device=device).unsqueeze(-1) + (s - n)  # the last query sees every key
        keep = (torch.arange(s, device=device) <= queries).view(1, 1, n, s)
    return (~keep).expand(keep.shape[0], 1, n, s).repeat(1, 1, groups, 1)


def _row_chunks(qs: torch.Tensor, k: torch.Tensor, masked: torch.Tensor):
    """``(rows, mask)`` slices of at most ``ROW_VALUES`` scores each (the forward's transient memory)."""
    b, kv, gn, s = qs.shape[0], qs.shape[1], qs.shape[2], k.shape[2]
    step = max(1, ROW_VALUES // max(1, kv * gn * s))
    for r in range(0, b, step):
        rows = slice(r, r + step)
        yield rows, masked[rows] if masked.shape[0] > 1 else masked


def _probs(qs: torch.Tensor, k: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Softmax probabilities of the scaled queries against the keys, masked entries at the dtype's lowest
    (a query that may attend to no key, a padding row, then averages instead of making NaN; its output is
    never read). Computed in float32 inside the softmax, written in ``qs.dtype``."""
    scores = (qs @ k.transpose(-1, -2)).masked_fill_(masked, torch.finfo(qs.dtype).min)
    return torch.softmax(scores, -1)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
):
    """A transformers attention function (``AttentionInterface``): ``ShortAttention`` where it is the faster
    (module docstring), transformers' ``sdpa_attention_forward`` otherwise. Returns ``([B, L, H, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _short(module, query, key, attention_mask, dropout, is_causal, kwargs):
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        keep = None if attention_mask is None else attention_mask[..., : key.shape[-2]]
        if keep is not None and keep.dtype != torch.bool:
            keep = keep == 0  # an additive mask that only masks (``_short`` checked)
        low = (x.to(torch.bfloat16) for x in (query, key, value))  # what autocast does to sdpa's inputs
        out = ShortAttention.apply(*low, keep, scale)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def _short(module, query, key, mask, dropout, is_causal, extras) -> bool:
    if query.device.type != "cpu":
        return False
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    if not autocast and not query.dtype == key.dtype == torch.bfloat16:
        return (
            False  # (under bf16 autocast the queries and keys arrive in float32, from the rotary embedding)
        )
    if key.shape[-2] > SHORT_KEYS or (dropout and module.training):
        return False
    if any(extras.get(name) is not None for name in _EXTRAS):
        return False
    if mask is not None and mask.dtype != torch.bool and not _only_masks(mask):
        return False  # a bias beyond masking (ALiBi and the like): sdpa adds it
    if mask is None and not (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        return False  # bidirectional attention without a mask: leave it to sdpa
    return query.shape[1] % key.shape[1] == 0


def _only_masks(mask: torch.Tensor) -> bool:
    """An additive mask of 0 (attend) and -inf or the dtype's lowest (masked) only."""
    return bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min)).all())


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model``'s attention computes in now: autocast's where autocast is on for the device of its
    weights, else its weights' (a float model's attention casts its inputs to neither)."""
    param = next(model.parameters())
    kind = param.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return param.dtype


def register() -> None:
    """Register ``"trivium"`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_short_attention(*models: torch.nn.Module | None) -> int:
    """Switch every transformers model in ``models`` (and their sub-models) that uses sdpa to ``"trivium"``;
    returns how many configs were switched. Models with another attention are left as they are."""
    from transformers import PreTrainedModel

    register()
    switched = 0
    for model in models:
        if model is None:
            continue
        for sub in model.modules():
            config = getattr(sub, "config", None)
            if isinstance(sub, PreTrainedModel) and getattr(config, "_attn_implementation", None) == "sdpa":
                config._attn_implementation = NAME
                switched += 1
    return switched
