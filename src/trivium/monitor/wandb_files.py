"""Read W&B's offline run files (``wandb/offline-run-*-{id}/run-{id}.wandb`` under the run folder).

A resumed run asks what an offline W&B run already holds (``WandbTracker.already_logged``): wandb's service
is a process of its own, so when ``trivium run`` is killed it may or may not have written what it was sent,
and sending those steps again would log them twice. The tests read the history back the same way.

The file is W&B's datastore: a 7-byte header (':W&B', magic 0xBEE1, version 0), then 32 KiB blocks of
chunks, each with a 7-byte header (CRC-32 of type and data, length, type: 1 full, 2 first, 3 middle, 4 last);
a block's tail shorter than a header is padding. wandb 0.31 has no Python reader of it (its service, written
in Go, reads and writes it), so the chunks are parsed here and the records decoded with wandb's own protobuf
classes. A file cut short (a killed writer) ends at its last whole record.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32768, 7


class DamagedWandbFile(ValueError):
    """Not a W&B datastore file, or a chunk whose checksum does not match before the end."""


def offline_files(run_dir: Path, run_id: str) -> list[Path]:
    """The offline ``.wandb`` files of ``run_id`` (one per process that opened it), oldest first.

    Each process's folder is ``offline-run-{YYYYmmdd_HHMMSS}-{id}``; a second process that opens the run within
    the same second gets ``...-{id}-1`` (then ``-2``...), so the order is (time, that suffix)."""
    folder = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    found = []
    for path in (Path(run_dir) / "wandb").glob(f"offline-run-*/run-{run_id}.wandb"):
        match = folder.fullmatch(path.parent.name)
        if match:
            found.append(((match[1], int(match[2] or 0)), path))
    return [path for _, path in sorted(found)]


def records(path: Path) -> Iterator[Any]:
    """The ``wandb_internal_pb2.Record`` messages of one offline ``.wandb`` file, up to its last whole one."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if len(data) < HEADER or struct.unpack("<4sHB", data[:HEADER]) != (b":W&B", 0xBEE1, 0):
        raise DamagedWandbFile(f"{path} is not a W&B datastore file")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:
            pos += room
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + HEADER : pos + HEADER + length]
        if len(chunk) < length:
            return  # cut short: the writer was killed mid-chunk
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise DamagedWandbFile(f"{path}: a chunk at byte {pos} does not match its checksum")
        pos += HEADER + length
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Each logged history row of one file: {key: value}, with ``_step``."""
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            yield {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}


def last_steps(run_dir: Path, run_id: str) -> dict[str, int]:
    """{key: the last step logged for it} over every offline file of ``run_id``."""
    last: dict[str, int] = {}
    for path in offline_files(run_dir, run_id):
        for row in history_rows(path):
            step = int(row.pop("_step"))
            for key in row:
                if not key.startswith("_"):
                    last[key] = max(step, last.get(key, -1))
    return last
