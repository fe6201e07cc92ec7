"""The one train loop, and what ends every train step (evaluate, log, checkpoint).

Every mode that trains runs ``train_loop``: mode ``both`` (explorer and trainer in one process), mode
``train`` from a persistent buffer (fed by an explore or a serve process) and mode ``train`` from a
dataset (SFT, DPO). What differs is where a step's batch comes from (a ``BatchSource``, see
``sources.py``) and how weights leave the trainer (a ``WeightSync``, see ``trivium.sync``):

    batch = source.next(step)  →  trainer.train_step(batch)  →  every sync_interval steps:
    sync.publish(trainer.export_weights(), version)  →  evaluate / log / checkpoint (StepEnd)

Versions: after train step ``t`` of a stage that started at version ``v0`` the weights are ``v0 + t``;
published ones are those of the sync steps (``sync.versions``).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trivium.faults import maybe_die
from trivium.launch import build
from trivium.launch.resume import ResumePoint, check_strategy, damage_named
from trivium.launch.stopping import RunStopped, StopRequests
from trivium.monitor.metrics import MetricsWriter, Progress
from trivium.monitor.phases import PEAK_RSS, close_step
from trivium.sync.versions import is_sync_step
from trivium.trainer.checkpoint import prune_checkpoints, save_checkpoint
from trivium.validation.load import Stage

log = logging.getLogger(__name__)

__all__ = ["RunState", "StepEnd", "eval_at_start", "eval_due", "train_loop"]


@dataclass
class RunState:
    """What carries from one stage to the next."""

    model: torch.nn.Module | None = None
    tokenizer: object | None = None
    global_step: int = 0
    version: int = 0
    resume: ResumePoint | None = None  # set until the stage it points into has picked it up
    config_dir: Path = Path()  # the config file's folder: where rank processes find plugins
    resumed_previous: Path | None = None  # the checkpoint before the one resumed from (see CheckpointDamaged)

    def take_resume(self, cfg, writer: MetricsWriter) -> tuple[int, dict | None, Path | None]:
        """The stage's last finished step, the saved trainer state and the checkpoint folder (0, None,
        None when not resuming), restoring weights, step and version.

        The metrics records written after the checkpoint are dropped (the resumed steps write them again)."""
        point, self.resume = self.resume, None
        if point is None:
            return 0, None, None
        check_strategy(point, cfg.trainer.strategy, cfg.trainer.world_size)
        self.resumed_previous = point.previous  # for damage found later, when the trainer loads its state
        with damage_named(point.path, point.previous):
            self.model, self.tokenizer = build.load_policy(str(point.path / "model"), cfg)
            saved = point.trainer_state()
            rng = saved.get("rng", {})
            if "python" in rng:
                random.setstate(rng["python"])
                torch.set_rng_state(rng["torch"])
        self.global_step, self.version = point.global_step, point.version
        t = cfg.trainer
        if (point.strategy, point.world_size) != (t.strategy, t.world_size):
            log.warning(
                "the checkpoint was written by trainer.strategy %s on %d rank(s); this run trains with %s on %d: "
                "the optimizer state is resharded on load (torch.distributed.checkpoint shards), the weights "
                "come from its model/ folder",
                point.strategy,
                point.world_size,
                t.strategy,
                t.world_size,
            )
        dropped = writer.drop_after(point.global_step)
        log.info(
            "resuming from %s (stage %s, step %d, weights version %d); %d metric record(s) after it dropped "
            "from %s",
            point.path,
            point.stage,
            point.step,
            point.version,
            dropped,
            writer.path.name,
        )
        return point.step, saved, point.path


def eval_due(cfg, step: int, total: int) -> bool:
    interval = cfg.explorer.eval_interval
    return bool(cfg.buffer.eval_tasksets) and (step == total or bool(interval and step % interval == 0))


def eval_at_start(cfg, explorer, stage: Stage, writer: MetricsWriter, state: RunState) -> dict:
    """The baseline of the learning curve: evaluate the starting weights as step 0; its record ({} when
    there is none), for the progress bar made after it."""
    if explorer is None or not explorer.eval_tasksets or not cfg.explorer.eval_at_start:
        return {}
    record = {"stage": stage.name, "step": 0, "global_step": state.global_step, **explorer.evaluate()}
    writer.write(record)
    return record


@dataclass
class StepEnd:
    """Ends every training step of a stage: evaluate when due, log the step's record, save a checkpoint when
    due (one object per stage, called once a step).

    The record is written before the checkpoint: a crash between the two leaves a record that the resumed
    run drops and writes again, never a checkpoint whose step has no record. ``resume`` is what the loop
    needs to continue exactly from this step; ``on_saved`` runs once the checkpoint is on disk.
    ``eval_sync``: where the evaluating explorer has an engine of its own that follows the trainer only
    when it evaluates (mode train), the sync that brings it the newest weights first.
    """

    stage: Stage
    run_dir: Path
    writer: MetricsWriter
    state: RunState
    progress: Progress
    total: int
    trainer: Any
    explorer: Any = None  # evaluates the eval task sets when due; None: no evaluation
    eval_sync: Any = None

    def __call__(
        self, step: int, record: dict, *, evaluate=True, resume=None, on_saved=None, save=False, profile=None
    ) -> Path | None:
        """End step ``step``; returns the checkpoint folder when one was written (``save``: whatever the
        interval says). ``profile``: ``(perf_counter at the step's start, seconds getting its batch)``,
        for ``time/step`` and ``time/idle`` (``monitor/phases.py``)."""
        cfg, state = self.stage.config, self.state
        eval_failed = None  # an evaluation that raised: the step's checkpoint is written before it is raised
        if evaluate and self.explorer is not None and eval_due(cfg, step, self.total):
            t0 = time.perf_counter()
            try:
                with PEAK_RSS.phase(record, "eval"):
                    if self.eval_sync is not None and self.explorer.model.version != state.version:
                        weights = self.trainer.export_weights(self.eval_sync.wire_dtype)
                        self.eval_sync.publish(weights, state.version)
                    record.update(self.explorer.evaluate())
            except Exception as error:
                eval_failed = error
            record["time/eval"] = time.perf_counter() - t0
        if profile is not None:
            close_step(record, time.perf_counter() - profile[0], profile[1])
        state.global_step += 1
        self.writer.write(
            {"stage": self.stage.name, "step": step, "global_step": state.global_step, **record}
        )
        self.progress.update(record)
        due = step == self.total or (cfg.trainer.save_interval and step % cfg.trainer.save_interval == 0)
        if save or due or eval_failed is not None:
            folder = self.run_dir / "checkpoints" / self.stage.name / f"step_{step}"
            meta = {
                "stage": self.stage.name,
                "step": step,
                "global_step": state.global_step,
                "version": state.version,
                "strategy": cfg.trainer.strategy,
                "world_size": cfg.trainer.world_size,
            }
            trainer_state = {**self.trainer.state_dict(), "resume": resume or {}}
            save_checkpoint(folder, self.trainer, state.tokenizer, trainer_state, meta)
            prune_checkpoints(folder.parent, cfg.trainer.keep_checkpoints)
            if on_saved is not None:
                on_saved()
            if eval_failed is not None:
                raise EvalFailed(self.stage.name, step, folder, eval_failed) from eval_failed
            return folder
        return None


class EvalFailed(RuntimeError):
    """The evaluation after a step raised; the step's checkpoint was written first, so no trained step is
    lost: a rerun resumes after it."""

    def __init__(self, stage: str, step: int, checkpoint: Path, cause: BaseException):
        super().__init__(
            f"the evaluation after step {step} of stage {stage} failed: {cause}. The step's checkpoint "
            f"{checkpoint} holds everything trained so far: fix the cause (e.g. the eval task set), then run "
            "the same command again to continue from it (that step's evaluation is not redone)"
        )
        self.cause = cause


def train_loop(
    end_step: StepEnd, source, trainer, sync, *, done: int, start_version: int, sync_interval: int
) -> None:
    """Train steps ``done + 1 .. end_step.total``; the one loop of every mode that trains.

    ``source`` gives each step's batch (``sources.py``), ``sync`` (None: nothing to publish to) takes the
    weights after every ``sync_interval`` steps and after the last. SIGTERM or Ctrl-C ends the loop after
    the step in flight, with its checkpoint (``stopping.py``)."""
    try:
        with StopRequests() as stop:
            _steps(end_step, source, trainer, sync, stop, done, start_version, sync_interval)
    finally:
        try:
            source.close()
        finally:
            try:
                if sync is not None:
                    sync.close()
            finally:
                end_step.progress.close()  # a failed run too: the bar gives the console back to logging


def _steps(end_step, source, trainer, sync, stop, done, start_version, sync_interval) -> None:
    """The steps of ``train_loop``; a stop request ends them after a step, its checkpoint written."""
    state, total = end_step.state, end_step.total
    for step in range(done + 1, total + 1):
        t0 = time.perf_counter()
        batch, record = source.next(step, trainer_version=start_version + step - 1)
        t1 = time.perf_counter()
        with PEAK_RSS.phase(record, "train"):
            record.update(trainer.train_step(batch) if batch else {"train/skipped_steps": 1.0})
        record["time/train"] = time.perf_counter() - t1
        maybe_die("train", step)
        if is_sync_step(step, sync_interval, total):
            state.version = start_version + step
            if sync is not None:
                t2 = time.perf_counter()
                with PEAK_RSS.phase(record, "sync"):
                    record.update(sync.publish(trainer.export_weights(sync.wire_dtype), state.version))
                record["time/sync"] = time.perf_counter() - t2
        # read once: a request that lands while this step's record and checkpoint are written is served
        # after the next step (reading it twice stopped a run whose checkpoint had not been asked for)
        requested = stop.requested
        saved = end_step(
            step,
            record,
            evaluate=source.eval_in_loop(step),
            resume={"start_version": start_version, **source.resume_state()},
            on_saved=source.checkpointed,
            save=requested is not None,
            profile=(t0, t1 - t0),
        )
        if requested is not None and step < total:
            raise RunStopped(
                f"stopped by {requested} after step {step} of stage {end_step.stage.name}; its "
                f"checkpoint is {saved}: run the same command again to continue from it"
            )
        source.after_step(step, step < total and eval_due(end_step.stage.config, step, total))
