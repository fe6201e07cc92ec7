"""Weight sync through files: the trainer publishes versions, rollout models in other processes load them.

A version is a folder ``v{version:08d}`` holding ``model.safetensors`` and ``meta.json`` (version and a
checksum of the weights). It is written under a temporary name and renamed into place, so a reader sees
either the whole version or none of it; a crash mid-write leaves a ``.tmp`` folder that is ignored and
cleaned up by the next publish. After loading, the reader checks the engine's checksum against the
file's (``weights.check_loaded``). The folder must be shared by both sides (one machine, or a network
file system); the newest ``keep`` versions are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from trivium.models.weights import (
    WeightSyncError,
    check_finite,
    check_loaded,
    floating_dtype,
    untie,
    weights_checksum,
)

__all__ = ["CheckpointSync"]

WEIGHTS = "model.safetensors"
META = "meta.json"


class CheckpointSync:
    wire_dtype: torch.dtype | None = None  # the file holds the trainer's dtype; readers cast on load

    def __init__(self, folder: str | Path, keep: int = 2, timeout_s: float = 600.0, poll_s: float = 0.1):
        self.folder = Path(folder)
        self.keep = keep
        self.timeout_s = timeout_s
        self.poll_s = poll_s

    @classmethod
    def from_config(cls, cfg, run_dir: Path, role: str, engine=None, plan=None) -> CheckpointSync:
        s = cfg.synchronizer
        return cls(s.checkpoint_dir or run_dir / "sync", timeout_s=s.wait_timeout_s)

    # --- trainer side -------------------------------------------------------------------------------
    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        check_finite(weights, version, f"publishing to {self.folder}")
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"v{version:08d}"
        tmp = self.folder / f"v{version:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
        save_file(untie(tensors), tmp / WEIGHTS)
        (tmp / META).write_text(json.dumps({"version": version, "checksum": weights_checksum(tensors)}))
        for f in (tmp / WEIGHTS, tmp / META):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self._prune()
        return {"sync/seconds": time.perf_counter() - t0}

    def publish_start(self, export, version: int) -> None:
        """Publish the starting weights when the folder holds none, so that a rollout process that starts
        later (or a server) loads the trainer's weights rather than its own."""
        if self.latest() is None:
            self.publish(export(), version)

    def latest(self) -> tuple[int, Path] | None:
        """The newest complete version, or None."""
        versions = self._versions()
        return versions[-1] if versions else None

    # --- rollout side -------------------------------------------------------------------------------
    def pull(self, engine, at_least: int | None = None, timeout_s: float | None = None) -> int | None:
        """Load the newest version when it is newer than the engine's; with ``at_least``, poll until the
        engine holds that version (``WeightSyncError`` after ``timeout_s``, default the config's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        loaded = None
        while True:
            loaded = self._load_newer(engine) or loaded
            if at_least is None or engine.version >= at_least:
                return loaded
            if time.monotonic() - t0 > timeout_s:
                raise WeightSyncError(
                    f"waited {timeout_s:.0f} s for weights version {at_least} in {self.folder} (the rollout "
                    f"model has {engine.version}): is the train process running, with the same config?"
                )
            time.sleep(self.poll_s)

    def _load_newer(self, engine) -> int | None:
        from safetensors.torch import load_file

        found = self.latest()
        if found is None or found[0] <= engine.version:
            return None
        version, path = found
        expected = json.loads((path / META).read_text())["checksum"]
        published = load_file(path / WEIGHTS)
        check_finite(published, version, f"loading {path}")
        dtype = engine.weights_dtype
        # an engine in another precision: check the file against its checksum before loading it (a damaged
        # file is never loaded), then compare the engine with the file's weights cast to its dtype
        if dtype != floating_dtype(published):
            if weights_checksum(published) != expected:
                raise WeightSyncError(
                    f"{path / WEIGHTS} does not match its {META} checksum (damaged file?); nothing was loaded"
                )
            expected = weights_checksum(published, dtype)
        engine.update_weights(published, version)
        check_loaded(engine, expected, version, str(path))
        return version

    def close(self) -> None:
        pass

    def _versions(self) -> list[tuple[int, Path]]:
        if not self.folder.exists():
            return []
        return sorted(
            (int(p.name[1:]), p) for p in self.folder.glob("v*") if p.is_dir() and p.name[1:].isdigit()
        )

    def _prune(self) -> None:
        for _, p in self._versions()[: -self.keep] if self.keep > 0 else []:
            shutil.rmtree(p, ignore_errors=True)
