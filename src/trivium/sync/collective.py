"""Weight sync by broadcast from the trainer process to an explore process (torch.distributed).

The two processes form a process group of their own (gloo on CPU; NCCL where both sides hold CUDA
tensors) at ``synchronizer.collective_init`` (``tcp://HOST:PORT``; the trainer side listens there). The
group is private to the sync, not torch's default group, so a trainer that trains on several ranks keeps
the default group for them. A sync is three broadcasts from the trainer: the version, the weights (one
flat buffer per dtype, in name order, cast to the receiving engine's dtype) and a sha256 checksum; the
receiver checks what it loaded against it (``weights.check_loaded``).

Both sides agree on which versions are sent without talking: the trainer sends exactly the versions the
explorer will wait for (``versions.versions_needed``), so no broadcast waits for a receiver that has
already finished.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from trivium.models.weights import cast_floating, check_finite, check_loaded, weights_checksum

__all__ = ["CollectiveSync"]

TRAINER_RANK = 0


class CollectiveSync:
    def __init__(
        self,
        init_method: str,
        rank: int,
        backend: str = "gloo",
        timeout_s: float = 600.0,
        versions: Sequence[int] | None = None,
        wire_dtype: torch.dtype | None = None,
    ):
        """``rank`` 0 is the trainer (sender), 1 the explorer; ``versions``: what the sender sends (None:
        every published version); ``wire_dtype``: the dtype the receiving engine holds."""
        self.rank = rank
        self.versions = None if versions is None else set(versions)
        self.wire_dtype = wire_dtype
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
        self._group = _private_group(init_method, rank, backend, timeout_s)

    @classmethod
    def from_config(cls, cfg, run_dir, role: str, engine=None, plan=None) -> CollectiveSync:
        from trivium.models.bf16 import rollout_dtype
        from trivium.sync.versions import versions_needed

        s = cfg.synchronizer
        versions = None
        if plan is not None:
            versions = versions_needed(plan.total_steps, s.sync_interval, 0, plan.start_version)
        return cls(
            s.collective_init,
            TRAINER_RANK if role == "trainer" else 1,
            s.collective_backend,
            timeout_s=s.wait_timeout_s,
            versions=versions,
            wire_dtype=rollout_dtype(
                cfg.explorer.rollout.dtype,
                cfg.model.dtype,
                cfg.model.device,
                cfg.explorer.rollout.engine_type,
                cfg.trainer.precision,
                cfg.explorer.rollout.autocast_dtype,
            )[0],
        )

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        """Broadcast ``weights`` as ``version`` when the explorer waits for it; metrics of the send."""
        if self.versions is not None and version not in self.versions:
            return {}
        t0 = time.perf_counter()
        check_finite(weights, version, "broadcasting to the explore process")
        state = cast_floating(weights, self.wire_dtype)
        self._broadcast_meta(version, weights_checksum(state))
        for flat in _flatten(state, self.device):
            self._broadcast(flat)
        return {"sync/seconds": time.perf_counter() - t0}

    def publish_start(self, export, version: int) -> None:
        """Nothing to do: the explorer starts from the same weights (the same config's model)."""

    def pull(self, engine, at_least: int | None = None, timeout_s: float | None = None) -> int | None:
        """Receive versions until ``engine`` holds ``at_least`` (each receive blocks for the next send;
        the group's timeout bounds the wait). Without ``at_least`` there is nothing to poll: None."""
        loaded = None
        while at_least is not None and engine.version < at_least:
            loaded = self._receive(engine)
        return loaded

    def _receive(self, engine) -> int:
        version, checksum = self._broadcast_meta(0, "0" * 64)
        own = engine.state_dict()
        flats = _flatten(own, self.device)
        for flat in flats:
            self._broadcast(flat)
        engine.update_weights(_unflatten(own, flats), version)
        check_loaded(engine, checksum, version, "the trainer process (collective broadcast)")
        return version

    def close(self) -> None:
        self._group = None

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = TRAINER_RANK
        self._group.broadcast([tensor], opts).wait()

    def _broadcast_meta(self, version: int, checksum: str) -> tuple[int, str]:
        meta = torch.tensor([version, *bytes.fromhex(checksum)], dtype=torch.int64, device=self.device)
        self._broadcast(meta)
        values = meta.tolist()
        return int(values[0]), bytes(values[1:]).hex()


def _private_group(init_method: str, rank: int, backend: str, timeout_s: float):
    """A two-process group at ``tcp://host:port`` that is not torch's default group."""
    url = urlparse(init_method)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise ValueError(
            f"synchronizer.collective_init={init_method!r}: use tcp://HOST:PORT (the train process listens)"
        )
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(url.hostname, url.port, 2, rank == TRAINER_RANK, timeout=timeout)
    prefixed = dist.PrefixStore("trivium-weight-sync", store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefixed, rank, 2)
    return dist.ProcessGroupGloo(prefixed, rank, 2, timeout)


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
