"""Checkpoint files between trainer-rank actors and the driver, for clusters with no shared file system
(``cluster.checkpoint_files``).

A rank writes its part of a checkpoint (rank 0 the Hugging Face ``model/`` folder; with a multi-rank
strategy every rank its ``dcp/`` shard) where the driver asks. A rank that sees the run folder writes into
it; one that does not (a node with its own disks) writes into a temporary folder of its node and sends the
files to the driver through Ray's object store, in chunks of ``CHUNK`` bytes, and the driver writes them
into the checkpoint. On resume the driver sends the ``dcp/`` files back the same way to each rank that
does not see them.

Whether a rank sees the run folder is checked, not assumed: the driver writes a file with a random name
next to the checkpoint (``Visibility``) and asks each rank whether it is there.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from trivium.launch.ray_cluster import ClusterError

__all__ = ["CHUNK", "Packed", "Visibility", "pack", "routes", "sees", "unpack"]

CHUNK = 64 << 20  # bytes per object-store object: a large shard never has to fit in memory twice over

# a folder's files: (path relative to the folder, object refs of its chunks in order)
Packed = list[tuple[str, list[Any]]]


def pack(folder: Path) -> Packed:
    """Every file under ``folder`` put into the object store, a chunk at a time (in a Ray worker or the
    driver); the files themselves may be deleted once this returns."""
    import ray

    packed: Packed = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        chunks = []
        with open(path, "rb") as source:
            while block := source.read(CHUNK):
                chunks.append(ray.put(block))
        packed.append((path.relative_to(folder).as_posix(), chunks))
    return packed


def unpack(packed: Packed, folder: Path) -> int:
    """Write ``pack``'s files under ``folder`` (created); the bytes written."""
    import ray

    written = 0
    for name, chunks in packed:
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"a packed checkpoint file may not leave its folder: {name!r}")
        target = folder.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as sink:
            for ref in chunks:
                block = ray.get(ref)
                sink.write(block)
                written += len(block)
    return written


def sees(folder: str, marker: str) -> bool:
    """Whether this process sees the driver's ``marker`` file in ``folder`` (same path, same files)."""
    return (Path(folder) / marker).is_file()


class Visibility:
    """A file with a random name that the driver writes into ``folder`` and removes after: a rank that finds
    it at the same path shares the driver's file system there."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.marker = f".trivium-driver-{secrets.token_hex(8)}"

    @contextlib.contextmanager
    def written(self) -> Iterator[str]:
        path = self.folder / self.marker
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text("written by the trivium driver to check which trainer ranks see this folder\n")
        try:
            yield self.marker
        finally:
            path.unlink(missing_ok=True)


def routes(mode: str, seen: list[tuple[bool, str]], names: list[str], folder: Path, doing: str) -> list[bool]:
    """Per rank, whether its checkpoint files go through the driver, from ``cluster.checkpoint_files``
    (``mode``) and what each rank reported (``seen``: whether it sees ``folder``, and its node). ``shared``
    with a rank that does not see the folder is an error naming the rank and its node (raised before any
    rank starts the collective write or read)."""
    if mode == "driver":
        return [True] * len(names)
    blind = [f"{name} (node {node})" for name, (sees_it, node) in zip(names, seen) if not sees_it]
    if blind and mode == "shared":
        raise ClusterError(
            f"cluster.checkpoint_files=shared, but trainer rank actor(s) {', '.join(blind)} do not see the run "
            f"folder {folder} (checked before the {doing}): mount it at the same path on every trainer node, "
            "or set cluster.checkpoint_files: auto (or driver) to send those ranks' files through the driver"
        )
    return [not sees_it for sees_it, _ in seen]
