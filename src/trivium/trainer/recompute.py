"""``trainer.gradient_checkpointing``: each decoder layer's activations recomputed in the backward pass.

While gradients are recorded, a decoder layer (``parallel.decoder_layers``) runs under
``torch.utils.checkpoint`` (non-reentrant): autograd keeps the layer's inputs and the outputs of its fused
attention kernel only (``ATTENTION_OPS``), and the backward runs the rest of the layer's forward once more
to get it back. A micro-batch's activations fall from ``layers x (9h + 2kv + 4i)`` values a token
(``launch/memory_estimate.py``) to ``layers x (2h + heads)`` (the residual stream between the layers,
attention's output and log-sum-exp) plus one layer's full set while that layer's backward runs; the step
pays about one more forward of the layers less attention (a forward is about a third of a forward and
backward). It is the lever for a sequence too long to train even alone in a micro-batch; below that, fewer
rows a pass cost less (``trainer.max_tokens_per_micro_batch``: smaller passes run as fast on a CPU).
``trivium doctor`` sizes it and suggests it where no micro-batch fits otherwise.

Why not transformers' ``gradient_checkpointing_enable``: it recomputes only in ``train()`` mode, and the RL
trainer runs its model in eval mode (no dropout: the training pass's log-probs are the sampler's). The
wrapped ``forward`` is bound to the layer as an instance attribute: the module tree, the parameter names
and so the checkpoints stay exactly as they are, a deep copy (a reference model) binds its own, and
``trainer.compile`` traces it (torch compiles the checkpointed region as one). DDP and FSDP2 wrap the
layer's call around it, as torchtitan wraps its checkpointed blocks (tested on two DDP and on two FSDP2
ranks with LoRA against one rank without it: tests/trainer/test_parallel_parity.py). Passes without
gradients (old, reference, teacher log-probs) call the layer directly.
Dropout draws the same masks in the recomputation (checkpoint restores the RNG state), and autocast and
bf16's emulation hold there as in the forward, so the gradients are the same as without it (tested).
"""

from __future__ import annotations

import logging
import types

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from trivium.trainer.parallel import decoder_layers

log = logging.getLogger(__name__)

# Attention's fused kernels (sdpa's, on CPU and CUDA): their outputs (the attention output, h values a token,
# and the softmax's log-sum-exp, one a head) are kept and not recomputed, as in torchtitan's selective
# activation checkpointing: the backward of attention reads them, and at long sequences attention is much of
# a layer's forward (25M @4k on CPU: a step 1.53x the time with it recomputed; benchmarks/recompute.py).
ATTENTION_OPS = {
    packet
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if (packet := getattr(torch.ops.aten, name, None)) is not None
}


def _keep_attention(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if getattr(op, "overloadpacket", None) in ATTENTION_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _keeping_attention():
    return create_selective_checkpoint_contexts(_keep_attention)


def _recomputed_forward(self: torch.nn.Module, *args, **kwargs):
    forward = type(self).forward
    if not torch.is_grad_enabled():
        return forward(self, *args, **kwargs)
    return checkpoint(forward, self, *args, use_reentrant=False, context_fn=_keeping_attention, **kwargs)


def recompute_decoder_layers(model: torch.nn.Module, what: str = "the policy") -> int:
    """Make ``model``'s decoder layers recompute their activations in the backward pass (in place; again
    is a no-op); returns how many layers."""
    layers = decoder_layers(
        model, "trainer.gradient_checkpointing", "set trainer.gradient_checkpointing false for it"
    )
    for layer in layers:
        own = layer.__dict__.get("forward")
        if getattr(own, "__func__", None) is _recomputed_forward:
            continue
        if own is not None:
            raise ValueError(
                f"trainer.gradient_checkpointing: {type(layer).__name__}.forward is already replaced on the "
                "instance by other code, which recomputing would bypass; set trainer.gradient_checkpointing "
                "false for this model"
            )
        layer.forward = types.MethodType(_recomputed_forward, layer)
    log.info(
        "trainer.gradient_checkpointing: %d decoder layers (%s) of %s recompute their activations in the "
        "backward pass",
        len(layers),
        type(layers[0]).__name__,
        what,
    )
    return len(layers)


def recomputes(model: torch.nn.Module) -> bool:
    """Whether some layer of ``model`` recomputes its activations (``recompute_decoder_layers``)."""
    return any(
        getattr(m.__dict__.get("forward"), "__func__", None) is _recomputed_forward for m in model.modules()
    )
