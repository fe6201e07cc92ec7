"""The explore process of a decoupled run: explorer and trainer as two OS processes on one run folder.

    trivium run -c cfg.yaml --set mode=explore &      # samples, writes buffer.storage
    trivium run -c cfg.yaml --set mode=train          # reads it, trains, publishes weights

The explore process samples step s with weights of version >= k * floor((s - 1) / k) (k = sync_interval;
the loop is ``launch/explore_steps.py``'s, shared with an overlapped run's explorer thread), waiting for the
train process to publish them (``synchronizer.method`` checkpoint or collective, through
``WeightSync.pull``); with method ``memory`` it never waits and keeps its starting weights (pure data
generation). Each explore step is written with the key ``explore:{s}``, so an explore process that re-runs
a step after a crash stores nothing twice. The train process (``stages.storage_stage``) claims
``batch_size x repeat_times`` experiences per step, trains, publishes weights every k steps, and commits
its claims once a checkpoint that includes them is on disk.

Either process can be killed and restarted: the train process continues from its newest checkpoint
(claims after it go back to the buffer), the explore process after its last written step
(``explore_state.{stage}.pt``); the explore process keeps a heartbeat that the train process watches
while it waits for a batch (``launch/explore_heartbeat.py``). Each writes its own metrics file
(``metrics.explore.jsonl``, ``metrics.train.jsonl``); a restarted process drops its records after the point
it resumes from, so every step has exactly one record. The explore process evaluates.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from trivium.buffer.feed import StorageFeed
from trivium.faults import maybe_die
from trivium.files import atomic_path
from trivium.launch import build
from trivium.launch.explore_heartbeat import Heartbeat, heartbeat_path
from trivium.launch.explore_steps import Pacing, explore_steps
from trivium.launch.loop import eval_due
from trivium.launch.placement import start_explorer
from trivium.launch.resume import load_state_file
from trivium.sync.protocol import build_weight_sync

log = logging.getLogger(__name__)

__all__ = ["explore_loop"]


def explore_loop(stage, run_dir: Path, writer, state) -> None:
    from trivium.monitor.metrics import Progress

    cfg = stage.config
    taskset = build.train_tasks(cfg)
    total = build.total_steps(cfg, len(taskset))
    storage = build.storage(cfg, run_dir)
    explorer = start_explorer(  # only its put() is used
        cfg, state, taskset, StorageFeed(storage), run_dir / "failures.jsonl"
    )
    sync = None
    if cfg.synchronizer.method != "memory":
        sync = build_weight_sync(cfg, run_dir, "rollout", engine=explorer.model)
    k = cfg.synchronizer.sync_interval
    state_file = run_dir / f"explore_state.{stage.name}.pt"
    done = 0
    if state_file.exists():  # a restarted explore process continues after its last written step
        saved = load_state_file(state_file)
        done = saved["step"]
        explorer.load_state_dict(saved["explorer"])
        dropped = writer.drop_after(state.global_step + done)
        log.info(
            "explore process resumes after step %d of stage %s; %d metric record(s) after it dropped",
            done,
            stage.name,
            dropped,
        )
    if done == 0 and cfg.explorer.eval_at_start and cfg.buffer.eval_tasksets:
        record = {"stage": stage.name, "step": 0, "global_step": state.global_step, **explorer.evaluate()}
        writer.write(record)
    progress = Progress(f"{stage.name} (explore)", total, initial=done, enabled=cfg.monitor.progress_bar)
    heartbeat = Heartbeat(heartbeat_path(run_dir, stage.name), done, total)  # what the train process watches
    heartbeat.start()
    try:
        # each step written under the key explore:{step}: a re-run of it after a crash adds nothing
        pacing = Pacing(k, 0, state.version)
        for step, record in explore_steps(explorer, sync, range(done + 1, total + 1), pacing):
            maybe_die("explore", step)
            if eval_due(cfg, step, total):
                record.update(explorer.evaluate())
            # the record before the state: a crash between them re-runs the step, whose record is dropped
            writer.write(
                {"stage": stage.name, "step": step, "global_step": state.global_step + step, **record}
            )
            with atomic_path(state_file) as tmp:
                torch.save({"step": step, "explorer": explorer.state_dict()}, tmp)
            heartbeat.wrote(step)
            progress.update(record)
    except BaseException as error:
        heartbeat.fail(error)
        raise
    else:
        heartbeat.finish()
    finally:
        storage.close()
        progress.close()
        if sync is not None:
            sync.close()
    state.global_step += total
