"""How the trainer's model is laid out over ranks (``trainer.strategy``): single, DDP or FSDP2.

Every rank holds the step's whole batch of token ids (cheap next to the model), so every rank computes the
same mini-batch split, the same loss denominators (``LossScale`` of the whole mini-batch: global without
any reduction) and the same advantages. What is split is the model work: each mini-batch's rows are dealt
out to the ranks (rank r takes every W-th row), each rank runs forward/backward on its rows in
micro-batches, and gradients are summed over ranks, never averaged: a rank's loss is already its exact
share of the mini-batch loss. The result does not depend on the split, up to float summation order
(tests/trainer/test_parallel_parity.py). Log-probs that every rank needs (old, reference, teacher) are
computed on each rank's rows and summed over ranks into one ``[R, L]`` tensor.

Collectives need every rank to call them the same number of times: FSDP2 gathers parameters in every
forward and reduces gradients in every backward, DDP reduces in the last backward of a step. So
``passes`` gives every rank the same number of micro-batches; a rank short of rows runs its last passes on
one row with weight 0 (a wasted forward, only when a mini-batch has fewer rows than ranks x micro-batch).

- ``single``: one process, the model as it is.
- ``ddp``: a full replica per rank (torch ``DistributedDataParallel``), gradients all-reduced (summed) in
  the last backward of each optimizer step (``no_sync`` before it).
- ``fsdp2``: ``fully_shard`` per decoder layer and on the root: parameters, gradients and optimizer state
  sharded over ranks; gradients reduce-scattered (summed).

Not here: tensor or pipeline parallelism. Several machines: the ranks as Ray actors (launch/ray_trainer.py);
mixed precision: `trainer.precision` (trainer/precision.py).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trivium.registry import Registry, subclass_of

__all__ = ["STRATEGIES", "DDPParallel", "FSDP2Parallel", "Parallel", "make_parallel"]


class Parallel:
    """``single``: one rank. The base of the multi-rank strategies, whose collectives it leaves out."""

    name = "single"
    sharded = False  # optimizer state saved with torch.distributed.checkpoint (every rank its part)
    # What the placements and the doctor ask of a strategy (never its name):
    multi_rank = False  # runs as ranks in a process group (each its own process), even with world_size 1
    shards_parameters = False  # each rank holds 1/world_size of the parameters (no process holds them all)

    def __init__(self, device: torch.device, rank: int = 0, world_size: int = 1):
        self.device = torch.device(device)
        self.rank = rank
        self.world_size = world_size

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module, *, trainable: bool = True) -> torch.nn.Module:
        """Lay ``model`` out over the ranks (before its optimizer is built); ``trainable=False``: a frozen
        model (the reference) that only runs forward passes."""
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The Hugging Face module inside a wrapper (DDP); the model itself otherwise."""
        return model

    def passes(self, rows: torch.Tensor, micro_batch_size: int) -> Iterator[tuple[torch.Tensor, bool]]:
        """This rank's share of ``rows`` in micro-batches: ``(rows, real)`` pairs, the same number on every
        rank; ``real=False`` marks a filler pass (one row, weight 0) of a rank short of rows."""
        mine = rows[self.rank :: self.world_size]
        count = math.ceil(math.ceil(rows.numel() / self.world_size) / micro_batch_size)
        for p in range(count):
            part = mine[p * micro_batch_size : (p + 1) * micro_batch_size]
            yield (part, True) if part.numel() else (rows[:1], False)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks, in place (rows computed by one rank, zeros elsewhere: a gather)."""
        return tensor

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """Sum each value over ranks (every rank has the same keys)."""
        return values

    def accumulating(self, model: torch.nn.Module, last: bool):
        """Context of one backward of an optimizer step; ``last``: the one that reduces gradients."""
        return contextlib.nullcontext()

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's whole state dict (its own names) on rank 0; collective where the model is sharded."""
        return self.unwrap(model).state_dict()

    def save_sharded(self, model, optimizer, folder: Path) -> None:
        """Every rank writes its part of the model and optimizer state (multi-rank strategies)."""
        raise NotImplementedError("strategy single keeps its optimizer state in trainer_state.pt")

    def load_sharded(self, model, optimizer, folder: Path) -> None:
        raise NotImplementedError("strategy single keeps its optimizer state in trainer_state.pt")


class _MultiRank(Parallel):
    sharded = True
    multi_rank = True

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        keys = sorted(values)
        packed = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(packed)
        return dict(zip(keys, packed.tolist()))

    def save_sharded(self, model, optimizer, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder))

    def load_sharded(self, model, optimizer, folder: Path) -> None:
        """Load the optimizer state saved by ``save_sharded``, at this or another world size (DCP
        reshards); the model's weights come from the checkpoint's consolidated ``model/`` folder."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        optim_state = get_optimizer_state_dict(model, optimizer)  # the template (initialises empty state)
        dcp.load({"optimizer": optim_state}, checkpoint_id=str(folder))
        set_optimizer_state_dict(model, optimizer, optim_state)


class DDPParallel(_MultiRank):
    """A full replica per rank; gradients summed in the last backward of each optimizer step."""

    name = "ddp"

    def wrap(self, model: torch.nn.Module, *, trainable: bool = True) -> torch.nn.Module:
        if not trainable:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(
            model,
            device_ids=[self.device] if self.device.type == "cuda" else None,
            forward_sync_buffers=False,
        )
        ddp.register_comm_hook(None, _sum_hook)
        return ddp

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        return model.module if isinstance(model, DistributedDataParallel) else model

    def accumulating(self, model: torch.nn.Module, last: bool):
        return contextlib.nullcontext() if last else model.no_sync()


class FSDP2Parallel(_MultiRank):
    """Parameters, gradients and optimizer state sharded over ranks (``fully_shard`` per decoder layer)."""

    name = "fsdp2"
    shards_parameters = True

    def wrap(self, model: torch.nn.Module, *, trainable: bool = True) -> torch.nn.Module:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        layers = decoder_layers(model)
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # a rank's loss is its share: sum, never average
                module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
        return model

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)


def decoder_layers(
    model: torch.nn.Module, setting: str = "trainer.strategy fsdp2", instead: str = "use strategy ddp for it"
) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face model (``_no_split_modules``, e.g. Qwen2DecoderLayer), each of
    which FSDP2 shards as one unit (and ``trainer.compile`` compiles). A model that names none is refused
    for ``setting``, with what to do ``instead``."""
    from trivium.models.lora import base_model

    base = base_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{setting}: {type(base).__name__} names no decoder layer class in _no_split_modules, so there "
            f"is nothing to take layer by layer; {instead}"
        )
    return layers


def _sum_hook(state: Any, bucket):
    """DDP communication hook: all-reduce a gradient bucket as a sum (DDP's default divides by ranks)."""
    future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return future.then(lambda f: f.value()[0])


STRATEGIES: Registry[type[Parallel]] = Registry(
    "trainer strategy", doc="a trivium.trainer.parallel.Parallel subclass", check=subclass_of(Parallel)
)
STRATEGIES.register("single")(Parallel)
STRATEGIES.register("ddp")(DDPParallel)
STRATEGIES.register("fsdp2")(FSDP2Parallel)


def micro_rows(micro_batch_size: int, max_tokens: int, rows: int, width: int) -> int:
    """Rows per forward pass over ``rows`` rows (one rank's share) of ``width`` tokens each.

    At most ``micro_batch_size`` rows; with a token budget (``max_tokens`` > 0, trainer.
    max_tokens_per_micro_batch) at most ``max_tokens // width`` rows too, spread evenly over the passes
    it takes (64 rows under a cap of 20 run as 4 x 16, not 20 + 20 + 20 + 4), so that every pass has
    about the same memory peak and none is a tiny tail.
    """
    cap = micro_cap(micro_batch_size, max_tokens, width)
    if cap == micro_batch_size:
        return micro_batch_size
    return math.ceil(rows / math.ceil(rows / cap)) if rows > cap else cap


def micro_cap(micro_batch_size: int, max_tokens: int, width: int) -> int:
    """The most rows one pass may take at ``width`` tokens a row: ``micro_batch_size``, and with a token
    budget (``max_tokens`` > 0) ``max_tokens // width`` (at least 1)."""
    return min(micro_batch_size, max(1, max_tokens // width)) if max_tokens else micro_batch_size


def make_parallel(strategy: str, device: torch.device, rank: int = 0, world_size: int = 1) -> Parallel:
    """The ``trainer.strategy`` called ``strategy`` for this rank."""
    return STRATEGIES.get(strategy)(device, rank, world_size)
