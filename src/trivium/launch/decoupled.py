"""Explorer and trainer as two OS processes that share a run folder, a persistent buffer and weight files.

    trivium run -c cfg.yaml --set mode=explore &      # samples, writes buffer.storage
    trivium run -c cfg.yaml --set mode=train          # reads it, trains, publishes weights

The explore process samples step s with weights of version >= k * floor((s - 1) / k) (k = sync_interval),
waiting for the train process to publish them (``CheckpointSync``); with ``synchronizer.method: memory``
it never waits and keeps its starting weights (pure data generation). Each explore step is written with
the key ``explore:{s}``, so an explore process that re-runs a step after a crash stores nothing twice.
The train process claims ``batch_size x repeat_times`` experiences per step, trains, commits the claim,
and publishes weights every k steps. Both append to the run folder's ``metrics.jsonl`` (records carry
``role``); the explore process evaluates.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from trivium.launch import build
from trivium.launch.overlap import required_version, staleness_filter

log = logging.getLogger(__name__)


class StorageSink:
    """The explorer's output (``put``) into a persistent storage, keyed by explore step."""

    def __init__(self, storage):
        self.storage = storage

    def put(self, experiences) -> None:
        if experiences:
            self.storage.write(experiences, key=f"explore:{experiences[0].explore_step}")


def checkpoint_sync(cfg, run_dir: Path):
    from trivium.sync.checkpoint import CheckpointSync

    return CheckpointSync(cfg.synchronizer.checkpoint_dir or run_dir / "sync")


def explore_loop(stage, run_dir: Path, writer, state, make_explorer, eval_due) -> None:
    from trivium.monitor.metrics import Progress

    cfg = stage.config
    taskset = build.task_reader(cfg.buffer.taskset, cfg.seed, is_eval=False)
    total = build.total_steps(cfg, len(taskset))
    storage = build.storage(cfg, run_dir)
    explorer = make_explorer(cfg, state, taskset, StorageSink(storage))
    sync = checkpoint_sync(cfg, run_dir) if cfg.synchronizer.method == "checkpoint" else None
    k = cfg.synchronizer.sync_interval
    progress = Progress(f"{stage.name} (explore)", total, enabled=cfg.monitor.progress_bar)
    try:
        for step in range(1, total + 1):
            need = required_version(step, k, 0, start=state.version)
            waited = _wait_for_weights(sync, explorer.model, need, cfg) if sync else 0.0
            record = explorer.explore_step(step)
            record["sync/wait_seconds"] = waited
            if eval_due(cfg, step, total):
                record.update(explorer.evaluate())
            writer.write(
                {
                    "stage": stage.name,
                    "role": "explore",
                    "step": step,
                    "global_step": state.global_step + step,
                    **record,
                }
            )
            progress.update(record)
    finally:
        storage.close()
        progress.close()
    state.global_step += total


def _wait_for_weights(sync, model, version: int, cfg) -> float:
    t0 = time.monotonic()
    while True:
        sync.load_newer(model)
        if model.version >= version:
            return time.monotonic() - t0
        if time.monotonic() - t0 > cfg.synchronizer.wait_timeout_s:
            raise TimeoutError(
                f"explore process waited {cfg.synchronizer.wait_timeout_s:.0f}s for weights version {version} in "
                f"{sync.folder} (has {model.version}): is the train process running with the same config?"
            )
        time.sleep(0.1)


def train_from_storage_loop(stage, run_dir: Path, writer, state, make_trainer, finish_step) -> None:
    from trivium.buffer.replay import FIFO, ReplayPolicy
    from trivium.monitor.metrics import Progress

    cfg = stage.config
    s = cfg.buffer.storage
    per_step = cfg.buffer.batch_size * cfg.buffer.taskset.repeat_times
    total = build.total_steps(cfg, len(build.task_reader(cfg.buffer.taskset, cfg.seed, is_eval=False)))
    storage = build.storage(cfg, run_dir)
    recovered = storage.recover("trainer")  # claims of a previous, killed trainer go back to the buffer
    if recovered:
        log.info("returned %d experiences claimed by a previous train process to the buffer", recovered)
    trainer = make_trainer(cfg, state, total)
    strategy = build.sample_strategy(cfg, state.tokenizer)
    sync = checkpoint_sync(cfg, run_dir) if cfg.synchronizer.method == "checkpoint" else None
    policy = FIFO if s.policy == "fifo" else ReplayPolicy(**s.replay.model_dump())
    progress = Progress(f"{stage.name} (train)", total, enabled=cfg.monitor.progress_bar)
    start_version = state.version
    if sync is not None and sync.latest() is None:
        sync.publish(trainer.model.state_dict(), start_version)  # the starting weights
    try:
        for step in range(1, total + 1):
            t0 = time.monotonic()
            claim = storage.read(
                per_step, policy=policy, consumer="trainer", step=step, timeout=s.read_timeout_s
            )
            record = {"buffer/wait_seconds": time.monotonic() - t0}
            experiences, stale = staleness_filter(
                strategy(list(claim.experiences), step),
                state.version,
                cfg.synchronizer.max_staleness,
                cfg.synchronizer.staleness_policy,
            )
            record.update(stale)
            record.update(trainer.train_step(experiences))
            storage.commit(claim)
            if step % cfg.synchronizer.sync_interval == 0 or step == total:
                state.version = start_version + step
                if sync is not None:
                    sync.publish(trainer.model.state_dict(), state.version)
            record["role"] = "train"
            finish_step(cfg, stage, step, total, record, None, trainer, run_dir, writer, state, progress)
    finally:
        storage.close()
        progress.close()
