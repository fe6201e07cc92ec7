"""Log-probs of loss tokens only (no vocabulary projection of prompts and padding) equal the full path's;
micro-batches from a token budget give the same update."""

import contextlib
import copy
import dataclasses

import pytest
import torch
from tests.trainer.test_trainer import make_trainer, sampled_experiences

from trivium.config.schema import LoraConfig
from trivium.models import lora
from trivium.trainer.logprobs import (
    batched_logprobs,
    forward_logprobs,
    loss_width,
    output_head,
    rows_by_length,
)
from trivium.trainer.parallel import micro_rows
from trivium.types import collate


def count_head_rows(model):
    """Rows (positions) that went through the output head, counted by a forward hook."""
    seen = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape[:-1].numel()))
    return seen, handle


@pytest.mark.parametrize("pack_length", [None, 64])
def test_loss_tokens_only_equal_the_full_path(policy, tokenizer, pack_length):
    batch = collate(sampled_experiences(policy, tokenizer, n_prompts=3, group=3), 0, pack_length)
    mask = batch.loss_mask
    seen, handle = count_head_rows(policy)
    fast, fast_h = forward_logprobs(policy, batch, temperature=0.7, entropy=True)
    handle.remove()
    full, full_h = forward_logprobs(policy, batch, temperature=0.7, entropy=True, only_loss_tokens=False)
    assert seen == [0, int(mask.sum())]  # the model's own projection: none; then the loss tokens alone
    assert torch.allclose(fast[mask], full[mask], atol=1e-5)
    assert torch.allclose(fast_h[mask], full_h[mask], atol=1e-5)
    assert bool((fast[~mask] == 0).all()) and bool((fast_h[~mask] == 0).all())
    # gradients too: the same loss through either path
    grads = []
    for only in (True, False):
        policy.zero_grad()
        lp, _ = forward_logprobs(policy, batch, temperature=0.7, only_loss_tokens=only)
        (lp[mask].sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


@pytest.mark.parametrize("pack_length", [None, 100])
def test_columns_after_the_last_loss_token_are_not_run_and_change_nothing(policy, tokenizer, pack_length):
    exps = [  # answers cut to different lengths
        dataclasses.replace(
            e,
            tokens=e.tokens[: e.prompt_length + k],
            action_mask=e.action_mask[:k],
            logprobs=e.logprobs[:k],
        )
        for i, e in enumerate(sampled_experiences(policy, tokenizer, n_prompts=3, group=3))
        for k in [max(1, len(e.action_mask) - 2 * i)]
    ]
    batch = collate(exps, 0, pack_length)
    order = rows_by_length(batch.loss_mask, torch.arange(batch.num_rows))
    ends = [loss_width(batch.loss_mask[r : r + 1]) for r in order.tolist()]
    assert ends == sorted(ends, reverse=True)  # longest first
    short = order[len(order) // 2 :]  # the shorter half of the rows, still as wide as the longest row
    sub = batch.select_rows(short)
    used = loss_width(sub.loss_mask)
    assert used < sub.input_ids.shape[1]
    widths = []
    handle = policy.model.embed_tokens.register_forward_hook(
        lambda m, inp, out: widths.append(inp[0].shape[1])
    )
    fast, fast_h = forward_logprobs(policy, sub, temperature=0.7, entropy=True)
    handle.remove()
    full, full_h = forward_logprobs(policy, sub, temperature=0.7, entropy=True, only_loss_tokens=False)
    assert widths == [used] and fast.shape == full.shape  # trimmed for the model, full width back
    mask = sub.loss_mask
    assert torch.allclose(fast[mask], full[mask], atol=1e-5)
    assert torch.allclose(fast_h[mask], full_h[mask], atol=1e-5)
    assert bool((fast[:, used:] == 0).all())


def test_peft_models_take_the_fast_path_and_their_base_serves_as_reference(policy, tokenizer):
    model = lora.attach(copy.deepcopy(policy), LoraConfig(rank=4, alpha=8))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    assert output_head(model) is not None
    batch = collate(sampled_experiences(policy, tokenizer, n_prompts=2, group=2), 0)
    mask = batch.loss_mask
    fast = batched_logprobs(model, batch, 2)
    full = forward_logprobs(model, batch, only_loss_tokens=False)[0]
    assert torch.allclose(fast[mask], full[mask], atol=1e-5)
    with model.disable_adapter():
        base = batched_logprobs(model, batch, 2)
    assert torch.allclose(base[mask], batched_logprobs(policy, batch, 2)[mask], atol=1e-5)
    assert not torch.allclose(base[mask], fast[mask], atol=1e-3)  # the adapters do change it


def test_token_budget_sets_the_micro_batch_and_keeps_the_update(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    width = collate(exps, 0).input_ids.shape[1]
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    budgeted = make_trainer(a, micro=16, sgd=True, grad_clip=0.0, max_tokens_per_micro_batch=3 * width + 1)
    assert budgeted._micro_rows(collate(exps, 0)) == 3  # floor(budget / width) rows, under micro_batch_size
    tiny_budget = make_trainer(copy.deepcopy(policy), micro=16, max_tokens_per_micro_batch=1)
    assert tiny_budget._micro_rows(collate(exps, 0)) == 1  # never fewer than one row
    ma = budgeted.train_step(exps)
    mb = make_trainer(b, micro=16, sgd=True, grad_clip=0.0, max_tokens_per_micro_batch=0).train_step(exps)
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-6)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_token_budget_spreads_rows_evenly_over_its_passes():
    assert micro_rows(64, 4000, rows=64, width=200) == 16  # a cap of 20 rows: 4 passes of 16, not 20+20+20+4
    assert micro_rows(64, 4000, rows=15, width=200) == 20  # fewer rows than the cap: one pass
    assert micro_rows(8, 4096, rows=64, width=200) == 8  # micro_batch_size is the tighter bound
    assert micro_rows(64, 0, rows=64, width=200) == 64  # no budget: rows alone
    assert micro_rows(64, 1, rows=10, width=200) == 1  # never fewer than one row


def test_a_step_reports_its_phases(policy, tokenizer):
    metrics = make_trainer(policy, micro=4).train_step(sampled_experiences(policy, tokenizer, n_prompts=2))
    phases = {k for k in metrics if k.startswith("time/")}
    assert {
        "time/collate",
        "time/forward_backward",
        "time/optimizer",
        "time/advantages",
        "time/train",
    } <= phases
    parts = sum(v for k, v in metrics.items() if k.startswith("time/") and k != "time/train")
    assert 0 < parts <= metrics["time/train"]


def _chunked_and_full_head(temperature: float, autocast: bool, low_head: bool = False):
    """(log-probs, grad of hidden, weight, bias) through ``chunked_logprobs`` and through autograd over the
    whole [N, V] float32 log-softmax, for a head with a bias, 20 tokens, V = 50; ``low_head``: within
    ``head_gradients_in_autocast`` (trainer.head_grad_precision: autocast)."""
    import trivium.trainer.logprobs as logprobs

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=g) / 4)
        head.bias.copy_(torch.randn(50, generator=g))
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (20,), generator=g)
    upstream = torch.randn(20, generator=g)
    assert logprobs.chunkable(head)
    results = []
    for chunked in (True, False):
        head.zero_grad()
        hidden.grad = None
        low = logprobs.head_gradients_in_autocast() if low_head else contextlib.nullcontext()
        with low, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if chunked:
                lp = logprobs.chunked_logprobs(hidden, head.weight, head.bias, targets, temperature)
            else:
                logits = logprobs.project_fp32(head, hidden) / temperature
                lp = logits.log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
        (lp * upstream).sum().backward()
        results.append((lp.detach(), hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()))
    return results


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_head_gives_the_full_heads_values_and_gradients(monkeypatch, temperature, autocast):
    """Seven chunks of 3 tokens (the last one short), blocks of 7 vocabulary rows (the last one short): the
    same log-probs and the same gradients for the hidden states, the weight and the bias as autograd
    through the whole [N, V] float32 log-softmax, under bf16 autocast too (trainer.head_grad_precision's
    default, fp32: the head's products stay float32)."""
    import trivium.trainer.logprobs as logprobs

    monkeypatch.setattr(logprobs, "HEAD_CHUNK_VALUES", 3 * 50)  # 3 tokens a chunk at V = 50
    assert logprobs.backward_block(20, 50, 16) == 7
    ours, reference = _chunked_and_full_head(temperature, autocast=autocast)
    for got, expected in zip(ours, reference):
        assert got.dtype == torch.float32
        assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_asked_to_the_chunked_head_takes_its_gradient_products_in_bf16(monkeypatch, temperature):
    """With trainer.head_grad_precision: autocast, under bf16 autocast the log-probs and the bias's gradient (no product) stay float32-exact, and the
    two gradient products run in bf16, as every other layer's backward does under autocast: the hidden
    states' and the weight's gradients are float32 tensors within bf16's rounding of the exact ones, and
    not equal to them (the products did run in bf16)."""
    import trivium.trainer.logprobs as logprobs

    monkeypatch.setattr(logprobs, "HEAD_CHUNK_VALUES", 3 * 50)
    (lp, grad_h, grad_w, grad_b), (lp_ref, grad_h_ref, grad_w_ref, grad_b_ref) = _chunked_and_full_head(
        temperature, autocast=True, low_head=True
    )
    assert torch.allclose(lp, lp_ref, atol=1e-5)
    assert torch.allclose(grad_b, grad_b_ref, atol=1e-5)
    for got, expected in ((grad_h, grad_h_ref), (grad_w, grad_w_ref)):
        assert got.dtype == torch.float32
        relative = (got - expected).norm() / expected.norm()
        assert 0 < relative < 1e-2, relative


def test_the_chunked_heads_bf16_products_have_the_same_numerics_where_bf16_is_emulated(monkeypatch):
    """On a CPU without bf16 instructions the head's bf16 gradient products are float32 products of the
    bf16-rounded operands, rounded to bf16 (what ``Bf16MatmulEmulation`` computes, without its float32 copies
    of a block): the gradients equal the bf16 kernels' up to the order of float32 sums, and are not the
    float32 products' (the rounding is there)."""
    import trivium.models.bf16 as bf16
    import trivium.trainer.logprobs as logprobs

    monkeypatch.setattr(logprobs, "HEAD_CHUNK_VALUES", 3 * 50)
    runs = {}
    for emulate in (False, True):
        monkeypatch.setattr(bf16, "_EMULATE", emulate)
        with bf16.bf16_emulation("cpu"):
            runs[emulate] = _chunked_and_full_head(0.7, autocast=True, low_head=True)
    (lp, *grads), (lp_kernel, *kernel_grads) = runs[True][0], runs[False][0]
    exact = runs[True][1]  # float32 throughout
    assert torch.equal(lp, lp_kernel)
    for got, kernel, full in zip(grads[:2], kernel_grads[:2], exact[1:3]):
        assert (got - kernel).norm() / kernel.norm() < 2e-3
        assert (got - full).norm() > 0


def test_the_backward_blocks_hold_no_more_values_than_a_chunk():
    """A block's logits (tokens x rows) and its slice of the weight (rows x hidden) stay within
    ``HEAD_CHUNK_VALUES`` whatever the number of loss tokens, one token included."""
    from trivium.trainer.logprobs import HEAD_CHUNK_VALUES, backward_block

    for tokens in (0, 1, 100, 1500, 4096, 10**6):
        rows = backward_block(tokens, 151_936, 896)
        assert 1 <= rows <= 151_936
        assert rows * max(tokens, 896) <= HEAD_CHUNK_VALUES or rows == 1
    assert backward_block(1, 384, 64) == 384  # a small head is one block


def test_heads_the_chunked_path_cannot_stand_for_take_the_plain_one(policy):
    head = policy.get_output_embeddings()
    from trivium.trainer.logprobs import chunkable

    assert chunkable(head)
    assert not chunkable(head.to(torch.bfloat16))  # no float32 master weights
    handle = head.register_forward_hook(lambda *a: None)
    assert not chunkable(head)  # a hook would be skipped
    handle.remove()


def test_the_in_place_log_sum_exp_equals_torchs_on_every_kind_of_row():
    """``_logsumexp_`` overwrites its input instead of allocating temporaries of its size: the same values
    as ``torch.logsumexp`` for ordinary rows, rows with -inf entries, all -inf rows and large logits."""
    from trivium.trainer.logprobs import _logsumexp_

    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * 30
    x[1, :7] = float("-inf")
    x[2] = float("-inf")
    x[3] += 1e4
    expected = torch.logsumexp(x, dim=1)
    got = _logsumexp_(x.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(got[finite], expected[finite], rtol=1e-6, atol=1e-5)


def test_the_chunked_head_without_a_loss_token_gives_zero_gradients():
    """A micro-batch with no loss token sends no row through the head: its gradients are zero, not
    whatever memory the weight's gradient was made in."""
    from trivium.trainer.logprobs import chunked_logprobs

    head = torch.nn.Linear(16, 50)
    hidden = torch.randn(0, 16, requires_grad=True)
    lp = chunked_logprobs(hidden, head.weight, head.bias, torch.zeros(0, dtype=torch.long))
    (lp.sum() + 0 * head.weight.sum()).backward()
    assert lp.shape == (0,)
    assert torch.equal(head.weight.grad, torch.zeros_like(head.weight))
    assert torch.equal(head.bias.grad, torch.zeros_like(head.bias))


def test_the_setting_reaches_the_head_through_the_trainers_autocast():
    """trainer.head_grad_precision: autocast turns the head's low-precision products on inside the
    trainer's autocast context only (the backward reads it from the forward), fp32 leaves them off, and the
    run log's precision line says so."""
    from trivium.trainer.logprobs import _HEAD_GRADIENTS_IN_AUTOCAST
    from trivium.trainer.precision import choose_precision

    seen = {}
    for head in ("fp32", "autocast"):
        precision = choose_precision("bf16", torch.device("cpu"), head_grad_precision=head)
        with precision.autocast():
            seen[head] = _HEAD_GRADIENTS_IN_AUTOCAST.get()
        assert not _HEAD_GRADIENTS_IN_AUTOCAST.get()
        assert ("trainer.head_grad_precision" in precision.describe("bf16")) == (head == "autocast")
    assert seen == {"fp32": False, "autocast": True}
    fp32 = choose_precision("fp32", torch.device("cpu"), head_grad_precision="autocast")
    with fp32.autocast():
        assert not _HEAD_GRADIENTS_IN_AUTOCAST.get()  # nothing to take it from


def test_a_bf16_step_with_the_heads_products_in_bf16_moves_the_head_as_the_float32_products_do(
    policy, tokenizer
):
    """One bf16 GRPO step (plain SGD: the update is the gradient) with trainer.head_grad_precision fp32 and
    autocast: the head's update differs (its products did run in bf16) by bf16's rounding, no more."""
    from trivium.trainer.logprobs import output_head

    exps = sampled_experiences(policy, tokenizer)
    updates = []
    for head in ("fp32", "autocast"):
        model = copy.deepcopy(policy)
        trainer = make_trainer(
            model, micro=16, sgd=True, grad_clip=0.0, precision="bf16", head_grad_precision=head
        )
        assert trainer.precision.head_grad_precision == head
        trainer.train_step(exps)
        updates.append(output_head(model).weight.detach() - output_head(policy).weight.detach())
    relative = (updates[1] - updates[0]).norm() / updates[0].norm()
    assert 0 < relative < 3e-2, relative
