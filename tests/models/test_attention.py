"""``models/attention.py``: ShortAttention's values and gradients (float64 gradcheck; bf16 against a float64
reference, as close as sdpa's own bf16), its masks, the dispatch, and a model switched to it."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from trivium.models import attention
from trivium.models.attention import SHORT_KEYS, ShortAttention, use_short_attention
from trivium.trainer.precision import Precision


def qkv(b=2, h=4, kv=2, n=6, s=6, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(heads, length):
        return torch.randn(b, heads, length, d, generator=g, dtype=dtype).requires_grad_()

    return make(h, n), make(kv, s), make(kv, s)


def reference(q, k, v, keep, scale):
    """The math: grouped heads repeated, a float64 softmax, masked entries excluded."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = q.double() @ k.transpose(-1, -2) * scale
    if keep is None:
        n, s = q.shape[2], k.shape[2]
        keep = torch.arange(s) <= torch.arange(n).unsqueeze(-1) + (s - n)
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ v


def padding_keep(b, n, lengths):
    """sdpa_mask's boolean [B, 1, L, L] for right-padded rows: causal and real keys only."""
    real = torch.arange(n) < torch.tensor(lengths).unsqueeze(-1)  # [B, L]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return (causal & real[:, None, :]).unsqueeze(1)


@pytest.mark.parametrize("shape", [dict(), dict(h=4, kv=4), dict(h=6, kv=2, n=1, s=5), dict(n=3, s=7)])
def test_values_and_gradcheck_in_float64(shape):
    q, k, v = qkv(**shape)
    out = ShortAttention.apply(q, k, v, None, 0.35)
    assert torch.allclose(out, reference(q, k, v, None, 0.35), atol=1e-12)
    assert torch.autograd.gradcheck(lambda q, k, v: ShortAttention.apply(q, k, v, None, 0.35), (q, k, v))


def test_a_padding_mask_and_rows_chunked(monkeypatch):
    q, k, v = qkv(b=3, n=6, s=6)
    keep = padding_keep(3, 6, [6, 4, 2])
    expected = reference(q, k, v, keep, 0.5)
    monkeypatch.setattr(attention, "ROW_VALUES", 1)  # one row at a time
    out = ShortAttention.apply(q, k, v, keep, 0.5)
    real = torch.arange(6) < torch.tensor([6, 4, 2]).unsqueeze(-1)  # padding queries' outputs are not read
    assert torch.allclose(out.transpose(1, 2)[real], expected.transpose(1, 2)[real], atol=1e-12)

    def real_outputs(q, k, v):
        return ShortAttention.apply(q, k, v, keep, 0.5).transpose(1, 2)[real]

    assert torch.autograd.gradcheck(real_outputs, (q, k, v))


def test_bf16_is_as_close_to_float64_as_sdpa_is():
    q, k, v = qkv(b=4, h=8, kv=4, n=96, s=96, d=64, dtype=torch.bfloat16, seed=1)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    truth = reference(q, k, v, None, 0.125)
    exact = torch.autograd.grad(truth, (q, k, v), grad.double())
    errors = {}
    for name, fn in {
        "short": lambda: ShortAttention.apply(q, k, v, None, 0.125),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125, enable_gqa=True),
    }.items():
        out = fn()
        grads = torch.autograd.grad(out, (q, k, v), grad)
        errors[name] = [(out.double() - truth).abs().max()] + [
            (a.double() - b).abs().max() / b.abs().max() for a, b in zip(grads, exact)
        ]
    for short, sdpa in zip(errors["short"], errors["sdpa"]):
        assert short <= 3 * sdpa + 1e-3, errors


def test_dispatch_takes_short_bf16_cpu_causal_boolean_or_only_masking():
    module = torch.nn.Module()
    q, k, _ = (x.detach() for x in qkv(n=8, s=8, dtype=torch.bfloat16))

    def short(q, k, mask, dropout=0.0, is_causal=None, **extras):
        return attention._short(module, q, k, mask, dropout, is_causal, extras)

    assert short(q, k, None)
    assert short(q, k, torch.ones(2, 1, 8, 8, dtype=torch.bool))
    assert not short(q.float(), k.float(), None)  # fp32: sdpa
    long_k = torch.zeros(2, 2, SHORT_KEYS + 1, 8, dtype=torch.bfloat16)
    assert not short(q, long_k, None)
    masking = torch.zeros(2, 1, 8, 8, dtype=torch.bfloat16)
    masking[..., 3:] = float("-inf")  # an additive mask that only masks (the trainer's shared-prompt rows)
    assert short(q, k, masking)
    assert short(q, k, masking.clamp(min=torch.finfo(torch.bfloat16).min))  # transformers' lowest value
    assert not short(q, k, masking.nan_to_num(neginf=0.0) - 1.5)  # a bias (ALiBi and the like): sdpa's
    assert not short(q, k, None, sliding_window=4)
    assert not short(q, k, None, is_causal=False)  # bidirectional without a mask


def test_a_switched_model_trains_like_sdpa_under_bf16(tiny_model_dir, monkeypatch):
    models = [AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32) for _ in range(2)]
    Precision("bf16", "cpu", "test").prepare_attention(models[1])
    Precision("fp32", "cpu", "test").prepare_attention(models[0])  # fp32: left as it is
    assert [m.config._attn_implementation for m in models] == ["sdpa", "trivium"]
    assert use_short_attention(models[1]) == 0  # switched already
    calls = []
    apply = ShortAttention.apply
    monkeypatch.setattr(ShortAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    ids = torch.randint(3, 100, (3, 20), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(20) < torch.tensor([[20], [15], [9]])).long()  # right padding: a boolean mask
    results = []
    for model in models:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
        loss = logits.log_softmax(-1)[mask.bool()].max(-1).values.mean()
        loss.backward()
        results.append((logits[mask.bool()], [p.grad for p in model.parameters()]))
    assert len(calls) == models[1].config.num_hidden_layers
    (a, grads_a), (b, grads_b) = results
    assert (a - b).abs().max() <= 0.05 * a.abs().max()
    for ga, gb in zip(grads_a, grads_b):
        assert (ga - gb).norm() <= 0.05 * ga.norm() + 1e-6


def test_an_additive_mask_that_only_masks_gives_the_boolean_masks_output():
    q, k, v = (x.detach().to(torch.bfloat16) for x in qkv(n=8, s=8))
    keep = padding_keep(2, 8, [8, 5])
    additive = torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill_(~keep, float("-inf"))
    module = torch.nn.Module()
    a = attention.attention(module, q, k, v, keep)[0]
    b = attention.attention(module, q, k, v, additive)[0]
    assert torch.equal(a, b)
