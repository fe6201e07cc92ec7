"""Per-token log-probabilities of a TrainBatch under a causal LM, target-aligned with ``input_ids``."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch

from trivium.models.attention import compute_dtype
from trivium.models.bf16 import emulates_bf16
from trivium.trainer.parallel import Parallel
from trivium.types import TrainBatch


def token_logprobs(
    model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0, only_loss_tokens: bool = True
) -> torch.Tensor:
    """``[R, L]`` float32: entry ``[r, t]`` = log p(input_ids[r, t] | input_ids[r, :t]) at ``temperature``.

    Position 0 (and every packed sequence start) has no prediction and is 0; callers mask with
    ``batch.loss_mask``. ``only_loss_tokens``: entries outside ``loss_mask`` are 0 and their logits are
    never computed (see ``forward_logprobs``). Log-probs are float32 whatever the model dtype or autocast.
    """
    return forward_logprobs(model, batch, temperature, only_loss_tokens=only_loss_tokens)[0]


def forward_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float = 1.0,
    entropy: bool = False,
    only_loss_tokens: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` and, when asked, the full-vocabulary entropy ``[R, L]`` at the same positions.

    Only the positions that predict a ``loss_mask`` token get logits: the model runs with no vocabulary
    projection at all (``logits_to_keep`` = no position) and its final hidden states at those positions
    alone go through the output head, a ``[N, V]`` product instead of ``[R, L, V]`` (prompts and padding
    cost no vocabulary projection; that is most of a forward pass at 150k vocabularies and short answers).
    Entries outside ``loss_mask`` are 0. Models whose logits are not ``head(last hidden state)`` (logit
    soft-capping or scaling) and models without ``logits_to_keep`` take the full path, as does
    ``only_loss_tokens=False``. Logits are upcast to float32 before log-softmax in both.
    """
    head = output_head(model) if only_loss_tokens else None
    if head is None:
        return _full_logprobs(model, batch, temperature, entropy)
    width, used = batch.input_ids.shape[1], loss_width(batch.loss_mask)
    if batch.media is not None:  # image placeholders stay: the model checks their count against the images
        used = max(used, loss_width(batch.input_ids == batch.media.image_token_id))
    if used < width:
        # A causal LM's log-prob of a token depends on the tokens before it only: the columns after the
        # last loss token (padding of rows longer than these, trailing prompts) are not run at all.
        lp, ent = _head_logprobs(model, head, batch.forward_rows(slice(None), used), temperature, entropy)
        pad = (0, width - used)
        return torch.nn.functional.pad(lp, pad), None if ent is None else torch.nn.functional.pad(ent, pad)
    return _head_logprobs(model, head, batch, temperature, entropy)


def loss_width(loss_mask: torch.Tensor) -> int:
    """Columns up to and including the last loss token of any row (at least 1)."""
    cols = loss_mask.any(0).nonzero()
    return int(cols.max()) + 1 if cols.numel() else 1


def rows_by_length(loss_mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` ordered longest first by their last loss column, so that micro-batches taken in order hold
    rows of similar length and ``forward_logprobs`` trims each to its own width (the loss sums over rows:
    the order does not change it)."""
    positions = torch.arange(1, loss_mask.shape[1] + 1, device=loss_mask.device)
    last = (loss_mask[rows].long() * positions).amax(1)
    return rows[torch.argsort(last, descending=True, stable=True)]


def _head_logprobs(model, head, batch: TrainBatch, temperature: float, entropy: bool):
    """The loss-token path of ``forward_logprobs``: no vocabulary projection but of the loss positions."""
    out = model(
        **batch.model_inputs(compute_dtype(model)),
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=torch.empty(0, dtype=torch.long, device=batch.input_ids.device),
    )
    where = batch.loss_mask[:, 1:]  # [R, L-1]: position t-1 predicts loss token t
    hidden, targets = out.hidden_states[-1][:, :-1][where], batch.input_ids[:, 1:][where]  # [N, h], [N]
    if not entropy and chunkable(head):
        return _scatter(chunked_logprobs(hidden, head.weight, head.bias, targets, temperature), where), None
    logits = project_fp32(head, hidden)  # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lp = _scatter(picked - torch.logsumexp(logits, dim=-1), where)
    if not entropy:
        return lp, None
    from trivium.algorithm.losses_entropy import entropy_from_logits

    return lp, _scatter(entropy_from_logits(logits, 1.0), where)


def chunkable(head: torch.nn.Module) -> bool:
    """``chunked_logprobs`` can stand for ``head``: a plain linear layer with float32 (master) weights."""
    from torch.distributed.tensor import DTensor

    weight = getattr(head, "weight", None)
    return (
        isinstance(head, torch.nn.Linear)
        and type(head).forward is torch.nn.Linear.forward  # no adapter (LoRA) or hook of its own
        and not (head._forward_hooks or head._forward_pre_hooks)
        and weight.dtype == torch.float32
        and not isinstance(weight, DTensor)
    )


def chunked_logprobs(hidden, weight, bias, targets, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(hidden @ weight.T + bias)[n, targets[n]] / T`` per row, float32, differentiable in
    ``hidden``, ``weight`` and ``bias``, without a ``[N, V]`` tensor: ``HEAD_CHUNK_VALUES`` logits at a time
    (``ChunkedLogProbs``)."""
    return ChunkedLogProbs.apply(hidden, weight, bias, targets, float(temperature))


HEAD_CHUNK_VALUES = 1 << 24  # logits per chunk (64 MiB in float32): 110 tokens at a 152k vocabulary


class ChunkedLogProbs(torch.autograd.Function):
    """The loss tokens' log-probs through the vocabulary head, a chunk of tokens at a time.

    At a 152k vocabulary the logits of 4,096 loss tokens are 2.5 GB in float32, and autograd's log-softmax
    keeps them, their exponentials and their gradient: ~10 GB for one micro-batch. Here the forward keeps
    only each token's log-sum-exp; the backward computes the logits again (a third more of the head's
    arithmetic), a block of the vocabulary at a time for every loss token, and turns them in place into the
    gradient ``g * (onehot - softmax) / T``: the block's rows of the weight's gradient are one product over
    all tokens, written once, and the hidden states' gradient sums over the blocks. (By chunks of tokens,
    every chunk added a product into the whole ``[V, h]`` weight gradient: at 1,500 loss tokens x 151,936 on
    a 2-core AMX CPU, 7.14 s for the backward against 5.04 s by blocks, the same arithmetic.) Peak: one
    chunk's logits (``HEAD_CHUNK_VALUES``).

    Precision: the logits, log-sum-exp and log-probs are float32 always (autocast off), as
    ``project_fp32``: they are what the algorithm reads. So are, by default, the backward's two gradient
    products (``d @ W`` for the hidden states, ``d.T @ hidden`` for the weight). Under autocast within
    ``head_gradients_in_autocast`` (``trainer.head_grad_precision: autocast``) those two run in autocast's
    dtype, as every other layer's backward does under autocast, and land in float32 gradients (the hidden
    states' summed over the blocks in float32); the logits they start from are still float32. That was
    the default for a day and was reverted: the quickstart's 5-seed mean did not suffer, but CI's seed 0
    learned slower (docs/performance.md)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature):
        hidden = hidden.float()
        chunk = max(1, HEAD_CHUNK_VALUES // weight.shape[0])
        out = hidden.new_empty(hidden.shape[0])
        lse = hidden.new_empty(hidden.shape[0])
        buffer = _chunk_buffer(hidden, weight, chunk)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                logits = _chunk_logits(hidden[s : s + chunk], weight, bias, temperature, buffer)
                out[s : s + chunk] = logits.gather(1, targets[s : s + chunk, None]).squeeze(1)
                lse[s : s + chunk] = _logsumexp_(logits)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.product_dtype = _autocast_dtype(hidden.device.type) if _HEAD_GRADIENTS_IN_AUTOCAST.get() else None
        return out - lse

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_h = torch.zeros_like(hidden) if need_h else None
        # each block of the vocabulary writes its rows of the weight's (and bias's) gradient once
        grad_w = (torch.empty_like if n else torch.zeros_like)(weight) if need_w else None
        grad_b = (torch.empty_like if n else torch.zeros_like)(bias) if need_b and bias is not None else None
        g = grad_out.float()[:, None]
        block = backward_block(n, vocab, hidden.shape[1])
        buffer = hidden.new_empty(n * block)
        products = _GradientProducts(hidden, weight, block, ctx.product_dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for v in range(0, vocab if n else 0, block):
                w = weight[v : v + block]
                width = w.shape[0]
                d = torch.mm(hidden, w.t(), out=buffer[: n * width].view(n, width))  # [n, width] logits
                if bias is not None:
                    d.add_(bias[v : v + width])
                if ctx.temperature != 1.0:
                    d.div_(ctx.temperature)
                d.sub_(lse[:, None]).exp_().mul_(-g)  # -g * softmax, this block's columns
                hit = ((targets >= v) & (targets < v + width)).nonzero().squeeze(1)
                d.index_put_((hit, targets[hit] - v), g[hit, 0], accumulate=True)  # + g * onehot
                if ctx.temperature != 1.0:
                    d.div_(ctx.temperature)
                if grad_b is not None:
                    torch.sum(d, 0, out=grad_b[v : v + width])
                products(d, w, grad_h, None if grad_w is None else grad_w[v : v + width])
        return grad_h, grad_w, grad_b, None, None


def backward_block(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of the vocabulary per block of ``ChunkedLogProbs.backward``: a block's logits (``tokens`` of
    them a row) and a block of the weight (``hidden`` a row) no more values than a chunk's logits."""
    return min(vocab, max(1, HEAD_CHUNK_VALUES // max(tokens, hidden, 1)))


# trainer.head_grad_precision: autocast (set by ``Precision.autocast``, read by ``ChunkedLogProbs.forward``)
_HEAD_GRADIENTS_IN_AUTOCAST: ContextVar[bool] = ContextVar("head_gradients_in_autocast", default=False)


@contextlib.contextmanager
def head_gradients_in_autocast():
    """Within it, ``ChunkedLogProbs`` under autocast takes its backward's two gradient products in
    autocast's dtype (``trainer.head_grad_precision: autocast``); outside it, in float32."""
    token = _HEAD_GRADIENTS_IN_AUTOCAST.set(True)
    try:
        yield
    finally:
        _HEAD_GRADIENTS_IN_AUTOCAST.reset(token)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """Autocast's dtype where it is on for ``device_type``, else None."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class _GradientProducts:
    """The two gradient products of one vocabulary block of ``ChunkedLogProbs.backward``: ``grad_h +=
    d @ w`` and ``grad_w_rows = d.T @ hidden``, in float32, or, with a ``dtype`` (autocast's in the
    forward), with ``d``, ``w`` and ``hidden`` cast to it and the products upcast into the float32
    gradients. The low-precision operands and results live in buffers made once per backward, a block's
    worth, as the logits do (fresh blocks that large cost page faults on CPU: ``_chunk_buffer``).

    On a CPU without bf16 instructions (``models/bf16.py``'s emulation) the products are float32 products
    of the operands rounded to bf16, rounded to bf16 after: the emulation's numerics, without the float32
    copies of a block's operands it would make for every product (a block's logits again: +60 MiB a step
    at a 152k vocabulary)."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, block: int, dtype: torch.dtype | None):
        self.hidden, self.dtype = hidden, None if dtype in (None, hidden.dtype) else dtype
        if self.dtype is None:
            return
        n, h = hidden.shape
        self.emulate = self.dtype == torch.bfloat16 and emulates_bf16(hidden.device.type)
        self.hidden_low = hidden.to(self.dtype)
        self.d_low = hidden.new_empty(n * block, dtype=self.dtype)
        self.w_low = weight.new_empty(block, h, dtype=self.dtype)
        self.grad_h_low = hidden.new_empty(n, h, dtype=self.dtype)
        if self.emulate:  # float32 operands holding bf16 values
            self.hidden_low = self.hidden_low.float()
            self.w_wide, self.grad_h_wide = weight.new_empty(block, h), hidden.new_empty(n, h)
        else:
            self.grad_w_low = weight.new_empty(block, h, dtype=self.dtype)

    def __call__(self, d, w, grad_h, grad_w_rows) -> None:
        if self.dtype is None:
            if grad_h is not None:
                grad_h.addmm_(d, w)
            if grad_w_rows is not None:
                torch.mm(d.t(), self.hidden, out=grad_w_rows)
            return
        n, width = d.shape
        d_low, w_low = self.d_low[: n * width].view(n, width).copy_(d), self.w_low[:width].copy_(w)
        if self.emulate:
            d.copy_(d_low)  # d, w: their bf16 values in float32
            w = self.w_wide[:width].copy_(w_low)
            if grad_h is not None:
                grad_h.add_(self.grad_h_low.copy_(torch.mm(d, w, out=self.grad_h_wide)))
            if grad_w_rows is not None:
                torch.mm(d.t(), self.hidden_low, out=grad_w_rows)
                grad_w_rows.copy_(w_low.copy_(grad_w_rows))  # rounded to bf16 (w_low is free again)
            return
        if grad_h is not None:
            grad_h.add_(torch.mm(d_low, w_low, out=self.grad_h_low))
        if grad_w_rows is not None:
            grad_w_rows.copy_(torch.mm(d_low.t(), self.hidden_low, out=self.grad_w_low[:width]))


def _chunk_buffer(hidden: torch.Tensor, weight: torch.Tensor, chunk: int) -> torch.Tensor:
    """One ``[chunk, V]`` float32 buffer that every chunk's logits are written into. Allocating each
    chunk's logits anew (64 MiB at a 152k vocabulary, and as much again for log-sum-exp's temporaries)
    costs more than the arithmetic on them on CPU: blocks that large come from the kernel as fresh pages,
    and faulting them in (zeroed) took ~40% of the head's time at the 0.5B rung (docs/performance.md)."""
    return hidden.new_empty(min(chunk, hidden.shape[0]), weight.shape[0])


def _logsumexp_(x: torch.Tensor) -> torch.Tensor:
    """``torch.logsumexp(x, dim=1)`` of a 2-D tensor, computed in ``x`` (which it overwrites) instead of
    in temporaries of its size. Rows of -inf give -inf, as torch's."""
    top = x.amax(1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return x.sub_(top).exp_().sum(1).log_().add_(top.squeeze(1))


def _chunk_logits(hidden, weight, bias, temperature: float, buffer: torch.Tensor) -> torch.Tensor:
    """``hidden @ weight.T + bias`` (over ``temperature``) in the first rows of ``buffer``."""
    logits = torch.mm(hidden, weight.t(), out=buffer[: hidden.shape[0]])
    if bias is not None:
        logits.add_(bias)
    return logits.div_(temperature) if temperature != 1.0 else logits


def project_fp32(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits ``head(hidden)``: under autocast too, where the head has float32 (master) weights.

    Under bf16 autocast the vocabulary projection would otherwise round every logit to bf16, whose
    spacing grows with the logit: 0.0625 at 8-16 and 0.125 at 16-32, the range of a trained model's top
    logits. That error lands directly in every log-prob, importance ratio and KL the algorithm reads,
    while the decoder layers' bf16 errors are damped by the norms after them (the MiniMax-M1 report,
    arXiv:2506.13585, traced its training/inference probability mismatch to the LM head's precision and
    fixed it by running the head in fp32). The final hidden states are fp32 already (the residual stream
    and the final norm run in fp32 under autocast), so this is the exact fp32 projection. Its cost is one
    fp32 product over the loss tokens only (``forward_logprobs``); models whose head weights are themselves
    low precision (``model.dtype`` bf16, no master copy) project in their dtype, upcast after."""
    weight = getattr(head, "weight", None)
    if weight is None or weight.dtype != torch.float32:
        return head(hidden).float()
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.float())


def _scatter(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``values`` [N] at the True entries of ``where`` [R, L-1], zeros elsewhere, one zero column in
    front: ``[R, L]`` target-aligned."""
    out = values.new_zeros(where.shape).masked_scatter(where, values)
    return torch.nn.functional.pad(out, (1, 0), value=0.0)


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module that maps final hidden states to logits, when the logits are exactly its output and
    the model can skip its own projection; None otherwise (the full path)."""
    import inspect

    inner = getattr(model, "module", model)  # DDP
    config = getattr(inner, "config", None)
    get_head = getattr(inner, "get_output_embeddings", None)
    if config is None or get_head is None:
        return None
    if any(getattr(config, k, None) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner  # PEFT
    if "logits_to_keep" not in inspect.signature(base.forward).parameters:
        return None
    return get_head()


def _full_logprobs(model, batch: TrainBatch, temperature: float, entropy: bool):
    """Logits at every position (``[R, L, V]``), log-probs at every position."""
    out = model(**batch.model_inputs(compute_dtype(model)), use_cache=False)
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, 1:]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lp = torch.nn.functional.pad(picked - torch.logsumexp(logits, dim=-1), (1, 0), value=0.0)
    if not entropy:
        return lp, None
    from trivium.algorithm.losses_entropy import entropy_from_logits

    return lp, torch.nn.functional.pad(entropy_from_logits(logits, 1.0), (1, 0), value=0.0)


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    micro_batch_size: int,
    temperature: float = 1.0,
    parallel: Parallel | None = None,
) -> torch.Tensor:
    """``token_logprobs`` without gradients, ``micro_batch_size`` rows at a time; with several ranks each
    computes its rows (``Parallel.passes``) and the ranks' parts are summed into the whole ``[R, L]``."""
    parallel = parallel or Parallel(batch.input_ids.device)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    order = rows_by_length(batch.loss_mask, torch.arange(batch.num_rows, device=out.device))
    for rows, real in parallel.passes(order, micro_batch_size):
        lp = token_logprobs(model, batch.forward_rows(rows), temperature)
        if real:
            out[rows] = lp
    return parallel.sum_(out)
