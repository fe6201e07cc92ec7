"""``trainer.compile``: ``torch.compile`` of the training model's decoder layers.

Each repeated block (``parallel.decoder_layers``, the unit FSDP2 shards too) is compiled in place with
``nn.Module.compile``: the module tree, its parameter names and so the checkpoints stay exactly as they are,
and only the layers' forward (and so their backward) runs as generated code. The embedding, the final norm
and the vocabulary head stay eager; the head goes through ``ChunkedLogProbs`` in chunks anyway. Layers share
one compiled graph (torch inlines module parameters as inputs), so the compile cost is one layer's, paid at
the first training pass and once more at the first pass without gradients (the old log-probs); shapes are
marked dynamic from the start, so new sequence lengths do not recompile.

What it buys is measured by ``benchmarks/compile.py`` (docs/performance.md): little on a CPU, which is why
it is off by default. It is not applied under bf16's matrix-product emulation (CPUs without bf16
instructions, ``models/bf16.py``), a dispatch mode the compiler does not trace; the log says so.
"""

from __future__ import annotations

import logging

import torch

from trivium.models.bf16 import emulates_bf16
from trivium.trainer.parallel import decoder_layers
from trivium.trainer.recompute import recomputes

log = logging.getLogger(__name__)


def compile_decoder_layers(model: torch.nn.Module, precision_name: str, device_type: str) -> int:
    """Compile ``model``'s decoder layers in place; returns how many were compiled (0 when skipped)."""
    if precision_name == "bf16" and emulates_bf16(device_type):
        log.warning(
            "trainer.compile: not applied: bf16 runs through the matrix-product emulation on this CPU "
            "(no bf16 instructions), which torch.compile does not trace; the run goes on eager"
        )
        return 0
    layers = decoder_layers(model, "trainer.compile", "set trainer.compile false for it")
    if recomputes(model):
        # trainer.gradient_checkpointing: a side effect inside a checkpointed region (the `kernels`
        # package's context variable that transformers' layers set) breaks the graph, and the layers would
        # run eager; not replaying that side effect in the recomputation is harmless
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    for layer in layers:
        layer.compile(dynamic=True)
    log.info(
        "trainer.compile: %d decoder layers (%s) compiled; the first training pass and the first pass "
        "without gradients pay the compile",
        len(layers),
        type(layers[0]).__name__,
    )
    return len(layers)
