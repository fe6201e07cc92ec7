"""Read a run's scalars back with each tracker library's own reader: {key: [(step, value), ...]}."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's ``EventAccumulator`` over every event file of ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_records(path: Path):
    """The ``wandb_internal_pb2.Record`` messages of one offline ``.wandb`` file.

    The file is W&B's datastore: a 7-byte header (':W&B', magic 0xBEE1, version 0), then 32 KiB blocks
    of chunks, each with a 7-byte header (CRC-32 of type and data, length, type: 1 full, 2 first,
    3 middle, 4 last); a block's tail shorter than a header is padding. wandb 0.31 has no Python reader of
    it any more (its service, written in Go, reads and writes it), so the tests parse the chunks and decode
    the records with wandb's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), path
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:
            pos += room
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"{path}: bad chunk at {pos}"
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run(run_dir: Path, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], dict, int]:
    """History {key: [(step, value)]}, the config of the last session, and how many sessions (offline
    run folders) the run id has, from every ``run-{id}.wandb`` under ``run_dir/wandb``."""
    history: dict[str, list[tuple[int, float]]] = {}
    config: dict = {}
    files = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    for path in files:
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = row.pop("_step")
                for key, value in row.items():
                    if not key.startswith("_"):
                        history.setdefault(key, []).append((step, value))
            elif kind == "config":
                config.update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "run":
                config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
    return history, config, len(files)


def mlflow_run(tracking_uri: str, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], dict, object]:
    """History, params and the run, through ``MlflowClient``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in run.data.metrics
    }
    return history, run.data.params, run
