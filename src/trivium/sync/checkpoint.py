"""Weight sync through files: the trainer publishes versions, explorers in other processes pick them up.

A version is a folder ``v{version:08d}`` holding ``model.safetensors`` and ``meta.json`` (version and a
checksum of the weights). It is written under a temporary name and renamed into place, so a reader sees
either the whole version or none of it; a crash mid-write leaves a ``.tmp`` folder that is ignored and
cleaned up by the next publish. After loading, the reader recomputes the checksum on its own copy of the
weights: a mismatch raises (a silently different policy would poison every experience it samples).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

WEIGHTS = "model.safetensors"
META = "meta.json"


class WeightSyncError(RuntimeError):
    pass


def floating_dtype(state: Mapping[str, torch.Tensor]) -> torch.dtype | None:
    """The dtype of the first floating-point tensor of ``state`` (a model's weights dtype), or None."""
    return next((t.dtype for t in state.values() if t.is_floating_point()), None)


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def cast_floating(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``state`` with its floating-point tensors in ``dtype`` (None, or already that dtype: unchanged)."""
    return {k: _cast(t, dtype) for k, t in state.items()}


def weights_checksum(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> str:
    """sha256 over names, dtypes, shapes and bytes of every tensor, in name order (device independent).

    ``dtype``: hash the floating-point tensors as cast to it, which is what a rollout engine in another
    precision (``explorer.rollout.dtype``) holds after loading them."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = _cast(state[name].detach(), dtype).to("cpu").contiguous()  # one tensor at a time: no full copy
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class CheckpointSync:
    def __init__(self, folder: str | Path, keep: int = 2):
        self.folder = Path(folder)
        self.keep = keep

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> Path:
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"v{version:08d}"
        tmp = self.folder / f"v{version:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        save_file(_untie(tensors), tmp / WEIGHTS)
        (tmp / META).write_text(json.dumps({"version": version, "checksum": weights_checksum(tensors)}))
        for f in (tmp / WEIGHTS, tmp / META):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self._prune()
        return final

    def latest(self) -> tuple[int, Path] | None:
        """The newest complete version, or None."""
        versions = (
            [(int(p.name[1:]), p) for p in self.folder.glob("v*") if p.is_dir() and p.name[1:].isdigit()]
            if self.folder.exists()
            else []
        )
        return max(versions) if versions else None

    def load_newer(self, engine) -> int | None:
        """Load the newest version into ``engine`` (``update_weights``) when newer than its own; verified."""
        from safetensors.torch import load_file

        found = self.latest()
        if found is None or found[0] <= engine.version:
            return None
        version, path = found
        meta = json.loads((path / META).read_text())
        published = load_file(path / WEIGHTS)
        dtype = floating_dtype(engine.state_dict())
        expected = meta["checksum"]
        # an engine in another precision (explorer.rollout.dtype): check the file before loading it, then
        # compare the engine with the file's weights cast to its dtype
        if dtype != floating_dtype(published):
            if weights_checksum(published) != expected:
                raise WeightSyncError(
                    f"{path / WEIGHTS} does not match its {META} checksum (damaged file?); nothing was loaded"
                )
            expected = weights_checksum(published, dtype)
        engine.update_weights(published, version)
        own = weights_checksum(engine.state_dict())
        if own != expected:
            raise WeightSyncError(
                f"weights of version {version} from {path} do not match after loading (checksum {own[:12]} vs "
                f"{expected[:12]}): the rollout model and the trainer's model differ in structure"
            )
        return version

    def _prune(self) -> None:
        versions = sorted(
            (int(p.name[1:]), p) for p in self.folder.glob("v*") if p.is_dir() and p.name[1:].isdigit()
        )
        for _, p in versions[: -self.keep] if self.keep > 0 else []:
            shutil.rmtree(p, ignore_errors=True)


def _untie(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share storage (tied embeddings): give each its own copy."""
    seen: dict[int, str] = {}
    out = {}
    for k, v in tensors.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.setdefault(ptr, k)
    return out
