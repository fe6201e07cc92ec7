"""Build a training stage and run it through the one train loop (``loop.py``): the small per-mode parts.

- ``online_stage``: mode both. The explorer samples into an in-process queue (or ``buffer.storage``), the
  trainer takes each step's experiences, weights move in memory; with ``sync_offset`` > 0 the explorer
  runs ahead in a thread (``overlap.py``).
- ``storage_stage``: mode train with ``buffer.storage``: trains on what an explore process (or a serve
  process) writes, publishes weights by ``synchronizer.method``, resumes itself from its newest checkpoint.
- ``dataset_stage``: mode train from a dataset (SFT, DPO); evaluates with an engine that follows the
  trainer in memory only when it evaluates.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trivium.launch import build
from trivium.launch.loop import RunState, StepEnd, eval_at_start, train_loop
from trivium.launch.placement import placement_of, start_explorer
from trivium.launch.resume import damage_named
from trivium.launch.sources import DatasetSource, ExperienceSource, OnlineSource
from trivium.models import lora
from trivium.monitor.metrics import MetricsWriter, Progress
from trivium.sync.protocol import build_weight_sync
from trivium.sync.versions import SyncPlan
from trivium.validation.load import Stage
from trivium.validation.validate import config_notes

log = logging.getLogger(__name__)

__all__ = ["dataset_stage", "online_stage", "storage_stage"]


def online_stage(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    cfg = stage.config
    s = cfg.synchronizer
    taskset = build.train_tasks(cfg)
    total = build.total_steps(cfg, len(taskset))
    per_step = cfg.buffer.batch_size * cfg.buffer.taskset.repeat_times
    done, saved, folder = state.take_resume(cfg, writer)
    if done >= total:
        return
    state.model = lora.prepare(state.model, cfg.model.lora)
    placement_of(cfg).launch_trainer(stage, state.config_dir)  # loads while the explorer starts
    experiences = _experience_source(cfg, run_dir, state, per_step)
    explorer = start_explorer(cfg, state, taskset, experiences.feed, run_dir / "failures.jsonl")
    with placement_of(cfg).trainer(
        stage, run_dir, state, total
    ) as trainer:  # after the explorer: FSDP2 shards in place
        _record_trajectories(stage, run_dir, state, trainer, done)
        sync = build_weight_sync(cfg, run_dir, "trainer", engine=explorer.model)
        start_version = _start_version(state, done, saved)
        ahead = None
        if s.sync_offset > 0:  # the explorer runs ahead in its own thread
            from trivium.launch.overlap import ExplorerThread

            def on_eval(record: dict) -> None:
                writer.write({"stage": stage.name, "global_step": state.global_step, **record})

            ahead = ExplorerThread(
                explorer, sync, (done, total), s.sync_interval, s.sync_offset, start_version, on_eval
            )
        source = OnlineSource(explorer, experiences, ahead)
        if saved is not None:
            with damage_named(folder, state.resumed_previous):
                trainer.load_state_dict(saved, folder)
            source.load(saved["resume"])
        log.info(
            "stage %s: online RL (%s), %d steps of %d tasks x %d samples, sync every %d step(s), offset %d",
            stage.name,
            trainer.algorithm.name,
            total,
            cfg.buffer.batch_size,
            cfg.buffer.taskset.repeat_times,
            s.sync_interval,
            s.sync_offset,
        )
        for note in config_notes(cfg):  # what check-config says about this stage, in the run's log too
            log.warning("stage %s: %s", stage.name, note)
        baseline = eval_at_start(cfg, explorer, stage, writer, state) if saved is None else {}
        if ahead is not None:
            ahead.start()
        # made last before the loop, which closes it whatever happens (it holds the console's log handlers)
        progress = Progress(stage.name, total, initial=done, enabled=cfg.monitor.progress_bar)
        progress.note_eval(baseline)
        end_step = StepEnd(stage, run_dir, writer, state, progress, total, trainer, explorer)
        train_loop(
            end_step,
            source,
            trainer,
            sync,
            done=done,
            start_version=start_version,
            sync_interval=s.sync_interval,
        )


def storage_stage(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    """Mode train reading ``buffer.storage``. With a task set (fed by an explore process) a step is its
    batch of task groups; without one (fed by a serve process) ``batch_size`` experiences a step."""
    from trivium.launch.resume import find_resume_point

    cfg = stage.config
    s = cfg.synchronizer
    if cfg.buffer.taskset is not None:
        per_step = cfg.buffer.batch_size * cfg.buffer.taskset.repeat_times
        total = build.total_steps(cfg, len(build.train_tasks(cfg)))
    else:
        per_step, total = cfg.buffer.batch_size, cfg.buffer.total_steps
    state.resume = find_resume_point(run_dir, [stage.name])  # the process resumes from its own checkpoint
    done, saved, folder = state.take_resume(cfg, writer)
    state.model = lora.prepare(state.model, cfg.model.lora)
    explore_process = stage.name if cfg.buffer.taskset is not None else None  # (a serve process: none)
    source = _experience_source(cfg, run_dir, state, per_step, explore_process)
    with placement_of(cfg).trainer(stage, run_dir, state, total) as trainer:
        _record_trajectories(stage, run_dir, state, trainer, done)
        if saved is not None:
            with damage_named(folder, state.resumed_previous):
                trainer.load_state_dict(saved, folder)
        source.load(saved["resume"] if saved is not None else {})  # hands back a killed process's claims
        start_version = _start_version(state, done, saved)
        # method memory: no rollout process follows the weights (an explore process generating data only)
        sync = None
        if s.method != "memory":
            sync = build_weight_sync(cfg, run_dir, "trainer", plan=SyncPlan(total, start_version))
            sync.publish_start(lambda: trainer.export_weights(sync.wire_dtype), state.version)
        progress = Progress(f"{stage.name} (train)", total, initial=done, enabled=cfg.monitor.progress_bar)
        end_step = StepEnd(stage, run_dir, writer, state, progress, total, trainer)
        train_loop(
            end_step,
            source,
            trainer,
            sync,
            done=done,
            start_version=start_version,
            sync_interval=s.sync_interval,
        )


def dataset_stage(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    from trivium.buffer.offline import PreferenceReader, SftReader
    from trivium.sync.memory import MemorySync

    cfg = stage.config
    if cfg.buffer.preference_dataset is not None:
        data = PreferenceReader(cfg.buffer.preference_dataset, state.tokenizer, seed=cfg.seed)
    else:
        data = SftReader(cfg.buffer.sft_dataset, state.tokenizer, seed=cfg.seed)
    total = build.total_steps(cfg, len(data))
    done, saved, folder = state.take_resume(cfg, writer)
    if done >= total:
        return
    data.tokenizer = state.tokenizer
    if isinstance(data, SftReader):
        data.vision = build.vision_processor(cfg, state.model)  # rows with images (a vision-language model)
    state.model = lora.prepare(state.model, cfg.model.lora)
    if cfg.buffer.eval_tasksets:
        placement_of(cfg).launch_trainer(stage, state.config_dir)  # loads while the explorer starts
    explorer = start_explorer(cfg, state) if cfg.buffer.eval_tasksets else None
    eval_sync = None if explorer is None else MemorySync(explorer.model, cfg.synchronizer.verify_checksum)
    source = DatasetSource(data, cfg.buffer.batch_size)
    with placement_of(cfg).trainer(stage, run_dir, state, total) as trainer:
        if saved is not None:
            with damage_named(folder, state.resumed_previous):
                trainer.load_state_dict(saved, folder)
            source.load(saved["resume"])
        log.info(
            "stage %s: %s from %s, %d steps of %d examples",
            stage.name,
            cfg.algorithm.algorithm_type,
            data.cfg.path,
            total,
            cfg.buffer.batch_size,
        )
        baseline = eval_at_start(cfg, explorer, stage, writer, state) if saved is None else {}
        # made last before the loop, which closes it whatever happens (it holds the console's log handlers)
        progress = Progress(stage.name, total, initial=done, enabled=cfg.monitor.progress_bar)
        progress.note_eval(baseline)
        end_step = StepEnd(stage, run_dir, writer, state, progress, total, trainer, explorer, eval_sync)
        # every optimizer step is a weights version (the evaluation engine catches up when it evaluates)
        train_loop(
            end_step,
            source,
            trainer,
            None,
            done=done,
            start_version=_start_version(state, done, saved),
            sync_interval=1,
        )


def _record_trajectories(stage: Stage, run_dir: Path, state: RunState, trainer, done: int) -> None:
    """Hand every RL step's batch to a ``TrajectoryRecorder`` (``monitor.trajectories``) where one process
    holds the whole model: the trainer of ``single``, rank 0's of ``ddp``."""
    cfg = stage.config
    t = cfg.monitor.trajectories
    if t.every == 0:
        return
    if not placement_of(cfg).holds_whole_model(cfg):
        log.info(
            "monitor.trajectories: not recorded for stage %s (trainer %s on backend %s: no process holds "
            "the whole model)",
            stage.name,
            cfg.trainer.strategy,
            cfg.cluster.backend,
        )
        return
    from trivium.monitor.trajectories import TrajectoryRecorder

    recorder = TrajectoryRecorder(run_dir, stage.name, t.every, t.per_step, state.tokenizer, resume_step=done)
    recorder.global_offset = state.global_step - done
    trainer.observer = recorder  # a Trainer, or a LeaderTrainer handing it to rank 0's


def _start_version(state: RunState, done: int, saved: dict | None) -> int:
    """The weights version the stage started from: recorded in the checkpoint resumed from (its step need
    not be a sync step), else the version now."""
    if saved is None:
        return state.version
    return saved["resume"].get("start_version", state.version - done)


def _experience_source(
    cfg, run_dir: Path, state: RunState, per_step: int, explore_process: str | None = None
) -> ExperienceSource:
    """The stage's feed (queue or storage, with its read policy), sample strategy and staleness bound."""
    s = cfg.synchronizer
    return ExperienceSource(
        build.feed(cfg, run_dir, per_step, explore_process),
        build.sample_strategy(cfg, state.tokenizer),
        per_step=per_step,
        max_staleness=s.max_staleness,
        staleness_policy=s.staleness_policy,
    )
