"""Explorer and trainer as two OS processes that share a run folder, a persistent buffer and weight files.

    trivium run -c cfg.yaml --set mode=explore &      # samples, writes buffer.storage
    trivium run -c cfg.yaml --set mode=train          # reads it, trains, publishes weights

The explore process samples step s with weights of version >= k * floor((s - 1) / k) (k = sync_interval),
waiting for the train process to publish them (``CheckpointSync``); with ``synchronizer.method: memory``
it never waits and keeps its starting weights (pure data generation). Each explore step is written with
the key ``explore:{s}``, so an explore process that re-runs a step after a crash stores nothing twice.
The train process claims ``batch_size x repeat_times`` experiences per step, trains, publishes weights
every k steps, and commits its claims once a checkpoint that includes them is on disk. Either process
can be killed and restarted: the train process continues from its newest checkpoint (claims after it
go back to the buffer), the explore process after its last written step (``explore_state.{stage}.pt``). Both append to the run folder's ``metrics.jsonl`` (records carry
``role``); the explore process evaluates.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from trivium.buffer.feed import StorageFeed
from trivium.faults import maybe_die
from trivium.launch import build
from trivium.launch.overlap import required_version, staleness_filter
from trivium.models.loading import resolve_dtype
from trivium.sync.collective import versions_needed

log = logging.getLogger(__name__)


def checkpoint_sync(cfg, run_dir: Path):
    from trivium.sync.checkpoint import CheckpointSync

    return CheckpointSync(cfg.synchronizer.checkpoint_dir or run_dir / "sync")


def weight_sync(cfg, run_dir: Path, rank: int):
    """The stage's weight channel between the processes: checkpoint files, a process group, or none."""
    method = cfg.synchronizer.method
    if method == "checkpoint":
        return checkpoint_sync(cfg, run_dir)
    if method == "collective":
        from trivium.sync.collective import CollectiveSync

        return CollectiveSync(
            cfg.synchronizer.collective_init,
            rank,
            cfg.synchronizer.collective_backend,
            timeout_s=cfg.synchronizer.wait_timeout_s,
        )
    return None


def explore_loop(stage, run_dir: Path, writer, state, eval_due) -> None:
    from trivium.monitor.metrics import Progress

    cfg = stage.config
    taskset = build.task_reader(cfg.buffer.taskset, cfg.seed, is_eval=False)
    total = build.total_steps(cfg, len(taskset))
    storage = build.storage(cfg, run_dir)
    explorer = build.make_explorer(  # only its put() is used
        cfg, state, taskset, StorageFeed(storage), run_dir / "failures.jsonl"
    )
    sync = weight_sync(cfg, run_dir, rank=1)
    k = cfg.synchronizer.sync_interval
    state_file = run_dir / f"explore_state.{stage.name}.pt"
    done = 0
    if state_file.exists():  # a restarted explore process continues after its last written step
        saved = torch.load(state_file, weights_only=False)
        done = saved["step"]
        explorer.load_state_dict(saved["explorer"])
        log.info("explore process resumes after step %d", done)
    progress = Progress(f"{stage.name} (explore)", total, initial=done, enabled=cfg.monitor.progress_bar)
    if done == 0 and cfg.explorer.eval_at_start and cfg.buffer.eval_tasksets:
        writer.write(
            {
                "stage": stage.name,
                "role": "explore",
                "step": 0,
                "global_step": state.global_step,
                **explorer.evaluate(),
            }
        )
    try:
        for step in range(done + 1, total + 1):
            need = required_version(step, k, 0, start=state.version)
            waited = _wait_for_weights(sync, explorer.model, need, cfg) if sync else 0.0
            # written under the key explore:{step}: a re-run of this step after a crash adds nothing
            record = explorer.explore_step(step)
            maybe_die("explore", step)
            _save_atomic({"step": step, "explorer": explorer.state_dict()}, state_file)
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
        if sync is not None and hasattr(sync, "close"):
            sync.close()
    state.global_step += total


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _wait_for_weights(sync, model, version: int, cfg) -> float:
    t0 = time.monotonic()
    if hasattr(sync, "receive"):  # collective: each receive blocks until the trainer sends the next version
        while model.version < version:
            sync.receive(model)
        return time.monotonic() - t0
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


def train_from_storage_loop(stage, run_dir: Path, writer, state, step_end) -> None:
    """``step_end``: run.StepEnd (passed in: run imports this module)."""
    from trivium.buffer.feed import StorageFeed
    from trivium.buffer.replay import FIFO, ReplayPolicy
    from trivium.monitor.metrics import Progress

    cfg = stage.config
    s = cfg.buffer.storage
    if cfg.buffer.taskset is not None:  # fed by an explore process: a step is its batch of task groups
        per_step = cfg.buffer.batch_size * cfg.buffer.taskset.repeat_times
        total = build.total_steps(cfg, len(build.task_reader(cfg.buffer.taskset, cfg.seed, is_eval=False)))
    else:  # fed by a serve process (or any writer): batch_size experiences a step, total_steps set
        per_step, total = cfg.buffer.batch_size, cfg.buffer.total_steps
    done, saved = _take_resume(run_dir, stage, state, cfg)
    policy = FIFO if s.policy == "fifo" else ReplayPolicy(**s.replay.model_dump())
    feed = StorageFeed(build.storage(cfg, run_dir), policy=policy, timeout_s=s.read_timeout_s)
    trainer = build.make_trainer(cfg, state, total)
    if saved is not None:
        trainer.load_state_dict(saved)
    # claims trained into the checkpoint are committed; those of a killed process go back to the buffer
    returned = feed.resume(saved["resume"].get("claims", []) if saved is not None else [])
    if returned:
        log.info("returned %d experiences claimed by a previous train process to the buffer", returned)
    strategy = build.sample_strategy(cfg, state.tokenizer)
    sync = weight_sync(cfg, run_dir, rank=0)
    progress = Progress(f"{stage.name} (train)", total, initial=done, enabled=cfg.monitor.progress_bar)
    end_step = step_end(stage, run_dir, writer, state, progress, total, trainer)
    start_version = state.version - done
    collective = sync is not None and hasattr(sync, "send")
    rollout_dtype = resolve_dtype(cfg.explorer.rollout.dtype or cfg.model.dtype)  # what the receiver holds
    needed = (
        set(versions_needed(total, cfg.synchronizer.sync_interval, start_version)) if collective else set()
    )
    if sync is not None and not collective and sync.latest() is None:
        sync.publish(trainer.model.state_dict(), state.version)  # the starting weights
    try:
        for step in range(done + 1, total + 1):
            t0 = time.monotonic()
            taken = feed.take(per_step, step)
            record = {"buffer/wait_seconds": time.monotonic() - t0, "role": "train"}
            experiences, stale = staleness_filter(
                strategy(taken, step),
                state.version,
                cfg.synchronizer.max_staleness,
                cfg.synchronizer.staleness_policy,
            )
            record.update(stale)
            record.update(trainer.train_step(experiences) if experiences else {"train/skipped_steps": 1.0})
            maybe_die("train", step)
            if step % cfg.synchronizer.sync_interval == 0 or step == total:
                state.version = start_version + step
                if collective and state.version in needed:
                    sync.send(trainer.model.state_dict(), state.version, dtype=rollout_dtype)
                elif sync is not None and not collective:
                    sync.publish(trainer.model.state_dict(), state.version)
            end_step(step, record, resume={"claims": feed.open_claims()}, on_saved=feed.checkpointed)
    finally:
        feed.close()
        progress.close()
        if collective:
            sync.close()


def _take_resume(run_dir: Path, stage, state, cfg) -> tuple[int, dict | None]:
    """A restarted train process continues from its newest checkpoint of this stage."""
    from trivium.launch.resume import find_resume_point

    point = find_resume_point(run_dir, [stage.name])
    if point is None:
        return 0, None
    state.resume = point
    return state.take_resume(cfg)
