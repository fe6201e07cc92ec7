"""Log-probs of loss tokens only (no vocabulary projection of prompts and padding) equal the full path's;
micro-batches from a token budget give the same update."""

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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_head_gives_the_full_heads_values_and_gradients(monkeypatch, temperature):
    """A head with a bias, seven chunks of 3 tokens (the last one short), under bf16 autocast too: the
    same log-probs and the same gradients for the hidden states, the weight and the bias as autograd
    through the whole [N, V] log-softmax."""
    import trivium.trainer.logprobs as logprobs

    monkeypatch.setattr(logprobs, "HEAD_CHUNK_VALUES", 3 * 50)  # 3 tokens a chunk at V = 50
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50)
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (20,), generator=g)
    upstream = torch.randn(20, generator=g)
    assert logprobs.chunkable(head)
    results = []
    for chunked in (True, False):
        head.zero_grad()
        hidden.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if chunked:
                lp = logprobs.chunked_logprobs(hidden, head.weight, head.bias, targets, temperature)
            else:
                logits = logprobs.project_fp32(head, hidden) / temperature
                lp = logits.log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
        (lp * upstream).sum().backward()
        results.append((lp.detach(), hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()))
    for ours, reference in zip(*results):
        assert ours.dtype == torch.float32
        assert torch.allclose(ours, reference, atol=1e-5), (ours - reference).abs().max()


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
