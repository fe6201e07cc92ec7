"""Weight sync by torch.distributed broadcast from the trainer process (rank 0) to an explore process.

Both processes join one process group (gloo on CPU; NCCL where both sides hold CUDA tensors) at
``init_method`` (``tcp://127.0.0.1:PORT``; both sides must use the same address). A sync is three
broadcasts from rank 0: the version, the weights (one flat buffer per dtype, in name order), and a
sha256 checksum of the weights; the receiver recomputes the checksum on what it loaded and raises on a
mismatch. Both sides must agree on which versions are sent: the trainer sends version ``t`` after train
step ``t`` when the explore process will need it (see ``versions_needed``), so no broadcast waits for a
receiver that has already finished.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping

import torch
import torch.distributed as dist

from trivium.sync.checkpoint import WeightSyncError, cast_floating, weights_checksum

TRAINER_RANK = 0


def versions_needed(total: int, interval: int, start: int = 0) -> list[int]:
    """Versions an explore process of ``total`` steps waits for: k * floor((s - 1) / k) > start, s ≤ total."""
    return sorted({start + interval * ((s - 1) // interval) for s in range(1, total + 1)} - {start})


class CollectiveSync:
    def __init__(self, init_method: str, rank: int, backend: str = "gloo", timeout_s: float = 600.0):
        self.rank = rank
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                init_method=init_method,
                rank=rank,
                world_size=2,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")

    def send(self, state: Mapping[str, torch.Tensor], version: int, dtype: torch.dtype | None = None) -> str:
        """Trainer side: broadcast ``state`` as ``version``, floating-point tensors cast to ``dtype`` (the
        receiving engine's, ``explorer.rollout.dtype``: the receiver's buffers are in it); returns the
        checksum sent."""
        state = cast_floating(state, dtype)
        checksum = weights_checksum(state)
        self._broadcast_meta(version, checksum)
        for flat in _flatten(state, self.device):
            dist.broadcast(flat, src=TRAINER_RANK)
        return checksum

    def receive(self, engine) -> int:
        """Explore side: receive the next version into ``engine`` (``update_weights``); verified."""
        version, checksum = self._broadcast_meta(0, "0" * 64)
        own = engine.state_dict()
        flats = _flatten(own, self.device)
        for flat in flats:
            dist.broadcast(flat, src=TRAINER_RANK)
        engine.update_weights(_unflatten(own, flats), version)
        got = weights_checksum(engine.state_dict())
        if got != checksum:
            raise WeightSyncError(
                f"collective sync of version {version}: checksum {got[:12]} after loading, trainer sent "
                f"{checksum[:12]}: the two models differ in structure or dtype"
            )
        return version

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def _broadcast_meta(self, version: int, checksum: str) -> tuple[int, str]:
        meta = torch.tensor([version, *bytes.fromhex(checksum)], dtype=torch.int64, device=self.device)
        dist.broadcast(meta, src=TRAINER_RANK)
        values = meta.tolist()
        return int(values[0]), bytes(values[1:]).hex()


def _flatten(state: Mapping[str, torch.Tensor], device) -> list[torch.Tensor]:
    """One contiguous buffer per dtype, tensors in name order (both sides build the same layout)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for name in sorted(state):
        by_dtype.setdefault(state[name].dtype, []).append(state[name].detach().reshape(-1))
    return [torch.cat(parts).to(device) for _, parts in sorted(by_dtype.items(), key=lambda kv: str(kv[0]))]


def _unflatten(like: Mapping[str, torch.Tensor], flats: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    order = sorted(like)
    dtypes = sorted({like[n].dtype for n in order}, key=str)
    out: dict[str, torch.Tensor] = {}
    for dtype, flat in zip(dtypes, flats):
        offset = 0
        for name in (n for n in order if like[n].dtype == dtype):
            size = like[name].numel()
            out[name] = flat[offset : offset + size].view(like[name].shape)
            offset += size
    return out
