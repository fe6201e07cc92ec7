"""``trivium run``: execute a validated run, stage by stage, in this process.

Each stage starts from the previous stage's final weights. Mode ``both`` is the synchronous online loop
(explore → train → sync → evaluate → save → log); mode ``train`` trains from a dataset (SFT).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from trivium.config.load import RunConfig, Stage
from trivium.faults import maybe_die
from trivium.launch import build
from trivium.launch.overlap import ExplorerThread, VersionGate, staleness_filter
from trivium.launch.resume import ResumePoint, find_resume_point, truncate_metrics
from trivium.monitor.metrics import METRICS_FILE, MetricsWriter, Progress
from trivium.trainer.checkpoint import prune_checkpoints, save_checkpoint

log = logging.getLogger(__name__)


class RunFolderExists(RuntimeError):
    pass


def run_dir_of(run: RunConfig) -> Path:
    c = run.config
    return Path(c.checkpoint_root) / c.project / c.name


def run(run_cfg: RunConfig, overwrite: bool = False, resume: bool = True) -> Path:
    """Run every stage; on a run folder that already holds a run, continue it from its newest checkpoint."""
    run_dir = run_dir_of(run_cfg)
    # An explore (or serve) and a train process share one run folder: whichever starts second joins it.
    shared = all(
        s.config.buffer.storage is not None and s.config.mode in ("explore", "train", "serve")
        for s in run_cfg.stages
    )
    names = [s.name for s in run_cfg.stages]
    point = None
    if (run_dir / METRICS_FILE).exists() and not shared:
        if overwrite:
            shutil.rmtree(run_dir)
        elif not resume:
            raise RunFolderExists(
                f"run folder {run_dir} already holds a run and --no-resume was given: continue it (drop "
                f"--no-resume), replace it (--overwrite), or start another (--set name=<new name>)"
            )
        else:
            point = find_resume_point(run_dir, names)
            if point is None:
                log.warning("run folder %s has no complete checkpoint to resume from: starting over", run_dir)
                shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {s.name: s.config.model_dump(mode="json") for s in run_cfg.stages}
    modes = "-".join(sorted({s.config.mode for s in run_cfg.stages}))
    name = "resolved_config.yaml" if not shared else f"resolved_config.{modes}.yaml"
    (run_dir / name).write_text(yaml.safe_dump(resolved, sort_keys=False))
    _quiet_libraries()
    _seed_everything(run_cfg.config.seed)
    if not torch.cuda.is_available():
        torch.set_flush_denormal(True)  # denormals slowed CPU training ~3x as weights shrank

    for stage in run_cfg.stages:  # every stage's data is read and checked before any model is loaded
        _check_data(stage)
    state = RunState()
    if point is not None:
        dropped = truncate_metrics(run_dir, point.global_step)
        log.info(
            "resuming %s from %s (stage %s, step %d); %d metric records after it dropped",
            run_dir,
            point.path,
            point.stage,
            point.step,
            dropped,
        )
        state.resume = point
    writer = MetricsWriter(run_dir)
    try:
        for i, stage in enumerate(run_cfg.stages):
            if point is not None and i < point.stage_index:
                continue  # finished before the checkpoint we resume from
            run_stage(stage, run_dir, writer, state)
    finally:
        writer.close()
    log.info("run finished: %s", run_dir)
    return run_dir


def _check_data(stage: Stage) -> None:
    """Load every task set and dataset of ``stage`` once: a bad row fails now, not after earlier stages."""
    from trivium.buffer.offline import PreferenceReader, SftReader

    cfg = stage.config
    if cfg.mode in ("both", "explore"):
        build.task_reader(cfg.buffer.taskset, cfg.seed, is_eval=False)
    if cfg.mode == "train" and cfg.buffer.sft_dataset is not None:
        SftReader(cfg.buffer.sft_dataset, tokenizer=None, seed=cfg.seed)
    if cfg.mode == "train" and cfg.buffer.preference_dataset is not None:
        PreferenceReader(cfg.buffer.preference_dataset, tokenizer=None, seed=cfg.seed)
    for ts in cfg.buffer.eval_tasksets:
        build.task_reader(ts, cfg.seed, is_eval=True)


@dataclass
class RunState:
    """What carries from one stage to the next."""

    model: torch.nn.Module | None = None
    tokenizer: object | None = None
    global_step: int = 0
    version: int = 0
    resume: ResumePoint | None = None  # set until the stage it points into has picked it up

    def take_resume(self, cfg) -> tuple[int, dict | None]:
        """The stage's first step to skip to and the saved state, restoring weights, step and version."""
        point, self.resume = self.resume, None
        if point is None:
            return 0, None
        self.model, self.tokenizer = build.load_policy(str(point.path / "model"), cfg)
        self.global_step, self.version = point.global_step, point.version
        saved = point.trainer_state()
        rng = saved.get("rng", {})
        if "python" in rng:
            random.setstate(rng["python"])
            torch.set_rng_state(rng["torch"])
        return point.step, saved


def run_stage(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    cfg = stage.config
    if state.model is None and state.resume is None and cfg.mode != "bench":
        path = build.ensure_model(cfg, run_dir)
        state.model, state.tokenizer = build.load_policy(path, cfg)
    if cfg.mode == "bench":
        from trivium.launch.bench import bench_loop

        bench_loop(stage, run_dir, writer, state)
    elif cfg.mode == "explore":
        from trivium.launch.decoupled import explore_loop

        explore_loop(stage, run_dir, writer, state, _eval_due)
    elif cfg.mode == "serve":
        from trivium.serve.serve_mode import serve

        serve(cfg, run_dir, state.model, state.tokenizer)
    elif cfg.mode == "train" and cfg.buffer.storage is not None:
        from trivium.launch.decoupled import train_from_storage_loop

        train_from_storage_loop(stage, run_dir, writer, state, StepEnd)
    elif cfg.mode == "both":
        _online_loop(stage, run_dir, writer, state)
    else:
        _train_loop(stage, run_dir, writer, state)


def _online_loop(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    cfg = stage.config
    taskset = build.task_reader(cfg.buffer.taskset, cfg.seed, is_eval=False)
    total = build.total_steps(cfg, len(taskset))
    per_step = cfg.buffer.batch_size * cfg.buffer.taskset.repeat_times
    sync = cfg.synchronizer
    done, saved = state.take_resume(cfg)
    if done >= total:
        return
    feed = _feed(cfg, run_dir, per_step)
    explorer = build.make_explorer(cfg, state, taskset, feed, run_dir / "failures.jsonl")
    trainer = build.make_trainer(cfg, state, total)
    strategy = build.sample_strategy(cfg, state.tokenizer)
    if saved is not None:
        trainer.load_state_dict(saved)
        explorer.load_state_dict(saved["resume"]["explorer"])
        feed.resume(saved["resume"].get("claims", []))
    log.info(
        "stage %s: online RL (%s), %d steps of %d tasks x %d samples, sync every %d step(s), offset %d",
        stage.name,
        trainer.algorithm.name,
        total,
        cfg.buffer.batch_size,
        cfg.buffer.taskset.repeat_times,
        sync.sync_interval,
        sync.sync_offset,
    )
    progress = Progress(stage.name, total, initial=done, enabled=cfg.monitor.progress_bar)
    end_step = StepEnd(stage, run_dir, writer, state, progress, total, trainer, explorer)
    if saved is None:
        _maybe_eval_at_start(cfg, explorer, stage, writer, state, progress)
    start_version = state.version - done
    ahead = None
    if sync.sync_offset > 0:  # the explorer runs ahead in its own thread (see launch/overlap.py)
        gate = VersionGate(start_version)
        ahead = ExplorerThread(
            explorer,
            gate,
            (done, total),
            sync.sync_interval,
            sync.sync_offset,
            start_version,
            on_eval=lambda rec: writer.write({"stage": stage.name, "global_step": state.global_step, **rec}),
        )
        ahead.start()
    try:
        for step in range(done + 1, total + 1):
            if ahead:
                record, explorer_state = ahead.next_result(step)
            else:
                record = explorer.explore_step(step)
                explorer_state = explorer.state_dict()
            maybe_die("explore", step)
            experiences = strategy(feed.take(int(record["rollout/experiences"]), step), step)
            experiences, stale = staleness_filter(
                experiences, start_version + step - 1, sync.max_staleness, sync.staleness_policy
            )
            record.update(stale)
            record.update(trainer.train_step(experiences) if experiences else {"train/skipped_steps": 1.0})
            maybe_die("train", step)
            if step % sync.sync_interval == 0 or step == total:
                state.version = start_version + step
                record.update(_memory_sync(trainer, explorer, state.version, sync.verify_checksum))
                if ahead:
                    ahead.gate.publish(state.version)
            end_step(
                step,
                record,
                evaluate=ahead is None or step == total,
                resume={"explorer": explorer_state, "claims": feed.open_claims()},
                on_saved=feed.checkpointed,
            )
            if ahead and step < total and _eval_due(cfg, step, total):
                ahead.request_eval(step)
    finally:
        if ahead:
            ahead.gate.stop()
            ahead.join()
        feed.close()
    progress.close()


def _memory_sync(trainer, explorer, version: int, verify: bool) -> dict[str, float]:
    """Copy the trainer's weights into the rollout model; with ``verify``, prove both sides equal."""
    import time

    from trivium.sync.checkpoint import WeightSyncError, floating_dtype, weights_checksum

    t0 = time.perf_counter()
    state = trainer.model.state_dict()
    explorer.model.update_weights(state, version)
    metrics = {"sync/seconds": time.perf_counter() - t0}
    if verify:
        loaded = explorer.model.state_dict()  # in the engine's dtype (explorer.rollout.dtype)
        sent, got = weights_checksum(state, floating_dtype(loaded)), weights_checksum(loaded)
        if sent != got:
            raise WeightSyncError(
                f"weights version {version}: the rollout model's checksum {got[:12]} differs from the trainer's "
                f"{sent[:12]} after the sync (different dtype or structure?)"
            )
        metrics["sync/checksum_seconds"] = time.perf_counter() - t0 - metrics["sync/seconds"]
    return metrics


def _feed(cfg, run_dir: Path, per_step: int):
    """The explorer-to-trainer channel: the persistent storage when configured, else an in-process queue."""
    from trivium.buffer.feed import MemoryFeed, StorageFeed
    from trivium.buffer.queue import ExperienceQueue

    if cfg.buffer.storage is not None:
        return StorageFeed(build.storage(cfg, run_dir), timeout_s=cfg.buffer.storage.read_timeout_s)
    return MemoryFeed(
        ExperienceQueue(cfg.buffer.queue_capacity or (2 + cfg.synchronizer.sync_offset) * per_step)
    )


def _train_loop(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    from trivium.buffer.offline import PreferenceReader, SftReader

    cfg = stage.config
    if cfg.buffer.preference_dataset is not None:
        data = PreferenceReader(cfg.buffer.preference_dataset, state.tokenizer, seed=cfg.seed)
    else:
        data = SftReader(cfg.buffer.sft_dataset, state.tokenizer, seed=cfg.seed)
    total = build.total_steps(cfg, len(data))
    done, saved = state.take_resume(cfg)
    if done >= total:
        return
    data.tokenizer = state.tokenizer
    trainer = build.make_trainer(cfg, state, total)
    explorer = build.make_explorer(cfg, state) if cfg.buffer.eval_tasksets else None
    if saved is not None:
        trainer.load_state_dict(saved)
        data.load_state_dict(saved["resume"]["data"])
    log.info(
        "stage %s: %s from %s, %d steps of %d examples",
        stage.name,
        cfg.algorithm.algorithm_type,
        data.cfg.path,
        total,
        cfg.buffer.batch_size,
    )
    progress = Progress(stage.name, total, initial=done, enabled=cfg.monitor.progress_bar)
    end_step = StepEnd(stage, run_dir, writer, state, progress, total, trainer, explorer)
    if saved is None:
        _maybe_eval_at_start(cfg, explorer, stage, writer, state, progress)
    for step in range(done + 1, total + 1):
        record = trainer.train_step(data.next_batch(cfg.buffer.batch_size))
        if data.skipped_rows:
            record["train/skipped_rows"] = float(data.skipped_rows)
        maybe_die("train", step)
        state.version = trainer.step
        end_step(step, record, resume={"data": data.state_dict()})
    progress.close()


def _maybe_eval_at_start(cfg, explorer, stage, writer, state, progress) -> None:
    if explorer is None or not explorer.eval_tasksets or not cfg.explorer.eval_at_start:
        return
    record = {"stage": stage.name, "step": 0, "global_step": state.global_step, **explorer.evaluate()}
    writer.write(record)
    progress.note_eval(record)


def _eval_due(cfg, step: int, total: int) -> bool:
    interval = cfg.explorer.eval_interval
    return bool(cfg.buffer.eval_tasksets) and (step == total or bool(interval and step % interval == 0))


@dataclass
class StepEnd:
    """Ends every training step of a stage: evaluate when due, log the step's record, save a checkpoint when
    due (one object per stage loop, called once a step).

    The record is written before the checkpoint: a crash between the two leaves a record that the resumed
    run drops and writes again, never a checkpoint whose step has no record. ``resume`` is what the loop
    needs to continue exactly from this step; ``on_saved`` runs once the checkpoint is on disk.
    """

    stage: Stage
    run_dir: Path
    writer: MetricsWriter
    state: RunState
    progress: Progress
    total: int
    trainer: Any
    explorer: Any = None  # evaluates the eval task sets when due; None: no evaluation

    def __call__(self, step: int, record: dict, *, evaluate=True, resume=None, on_saved=None) -> None:
        cfg, stage, state, trainer, explorer = (
            self.stage.config,
            self.stage,
            self.state,
            self.trainer,
            self.explorer,
        )
        if evaluate and explorer is not None and _eval_due(cfg, step, self.total):
            if cfg.mode == "train":  # the eval engine follows the trainer only when it evaluates
                explorer.model.update_weights(trainer.model.state_dict(), state.version)
            record.update(explorer.evaluate())
        state.global_step += 1
        self.writer.write({"stage": stage.name, "step": step, "global_step": state.global_step, **record})
        self.progress.update(record)
        if step == self.total or (cfg.trainer.save_interval and step % cfg.trainer.save_interval == 0):
            folder = self.run_dir / "checkpoints" / stage.name / f"step_{step}"
            meta = {
                "stage": stage.name,
                "step": step,
                "global_step": state.global_step,
                "version": state.version,
            }
            trainer_state = {**trainer.state_dict(), "resume": resume or {}}
            save_checkpoint(folder, trainer.model, state.tokenizer, trainer_state, meta)
            prune_checkpoints(folder.parent, cfg.trainer.keep_checkpoints)
            if on_saved is not None:
                on_saved()


def _quiet_libraries() -> None:
    """Keep the console and the cores for Trivium: no HF progress bars, no tokenizer thread pool."""
    # The Rust tokenizer's thread pool competes with torch for the cores while workflows tokenise in
    # threads (measured: rollout 25% slower on 2 cores); the explorer's threads give enough parallelism.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    # math-verify warns once per process that we disabled its signal-based timeouts (needed in threads)
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
