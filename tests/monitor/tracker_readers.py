"""Read a run's scalars back with each tracker library's own reader: {key: [(step, value), ...]}."""

from __future__ import annotations

import json
from pathlib import Path

from trivium.monitor.wandb_files import offline_files, records


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's ``EventAccumulator`` over every event file of ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_run(run_dir: Path, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], dict, int]:
    """History {key: [(step, value)]}, the config of the last session, and how many sessions (offline
    run folders) the run id has, from every ``run-{id}.wandb`` under ``run_dir/wandb``."""
    history: dict[str, list[tuple[int, float]]] = {}
    config: dict = {}
    files = offline_files(run_dir, run_id)
    for path in files:
        for record in records(path):
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
