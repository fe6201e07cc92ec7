"""``cluster.backend: ray``: the rollout engines, the explorer of a task set and the trainer ranks as Ray
actors (``ray_engines.py``, ``ray_explorer.py``, ``ray_trainer.py``) on the cluster ``ray_cluster.py``
connects to. The ``Placement`` of ``placement.py``; docs/cluster.md tells what runs where."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trivium.launch import build
from trivium.launch.placement import PLACEMENTS
from trivium.launch.ray_cluster import RayCluster, stage_requests
from trivium.launch.trainer_handle import trains

__all__ = ["RayPlacement"]


@PLACEMENTS.register("ray")
class RayPlacement:
    engines_in_driver = False  # each engine is an actor (or lives in the explorer actor)

    def open(self, run_cfg, config_dir: Path) -> None:
        cluster = RayCluster.connect(run_cfg.config, config_dir)
        for stage in run_cfg.stages:  # every stage's requests, before any actor starts
            cluster.check_fits(stage_requests(stage.config))

    def rollout_engine(self, policy, tokenizer, cfg, version: int, *, weights: str = "copy") -> Any:
        from trivium.launch.ray_engines import EnginePool
        from trivium.models.batching import BatchingRolloutModel

        policy, _ = build.rollout_policy(policy, weights)  # each actor loads a copy of its own
        pool = EnginePool.start(RayCluster.current(), policy, tokenizer, cfg, version, stage=cfg.name)
        return BatchingRolloutModel(pool)

    def explorer(self, cfg, state, model, taskset=None, queue=None, failure_log: Path | None = None) -> Any:
        """A task set's explorer runs as a Ray actor and this returns its stand-in; an evaluation-only
        explorer stays in this process (its engines are actors all the same)."""
        if taskset is None:
            return build.make_explorer(cfg, state, None, queue, failure_log, model=model)
        from trivium.launch.ray_explorer import RemoteExplorer

        log_path = None if failure_log is None else str(failure_log)
        return RemoteExplorer.start(
            RayCluster.current(), cfg, model, queue, log_path, state.config_dir, cfg.name
        )

    def launch_trainer(self, stage, config_dir: Path) -> None:
        """The rank actors, created now and waited for in ``trainer`` (``ray_trainer.launch_ranks``): a run's
        start takes the longest of the engines, the explorer and the ranks, not their sum."""
        from trivium.launch.ray_trainer import launch_ranks

        launch_ranks(RayCluster.current(), stage.config, stage.name, config_dir)

    @contextlib.contextmanager
    def trainer(self, stage, run_dir: Path, state, total: int) -> Iterator[Any]:
        """``trainer.world_size`` rank actors (launched with ``launch_trainer``, or here); the next stage starts
        from a plain (unsharded) model: the stage's last checkpoint."""
        from trivium.launch.ray_trainer import RayTrainer

        cfg = stage.config
        pad = state.tokenizer.pad_token_id
        trainer = RayTrainer.start(
            RayCluster.current(), cfg, stage.name, state.model, pad, total, state.config_dir
        )
        try:
            trainer.routes(run_dir / "checkpoints" / stage.name, "first checkpoint")  # shared: seen by all?
            yield trainer
        except BaseException:
            trainer.close()
            raise
        trainer.release()  # the ranks stay for a next stage like this one (end_stage)
        final = run_dir / "checkpoints" / stage.name / f"step_{total}" / "model"
        state.model, _ = build.load_policy(str(final), cfg)

    def holds_whole_model(self, cfg) -> bool:
        return False  # the trainer ranks are actors: the driver holds no trained model

    def end_stage(self, cfg, following) -> None:
        """A stage's explorer ends with it, and its rollout engines and trainer ranks unless the next stage
        asks for the same."""
        from trivium.launch.ray_trainer import kill_ranks, ranks_spec

        cluster = RayCluster.current()
        cluster.kill("explorer")
        if following is None or not _same_engines(cfg, following):
            cluster.kill("engine")
        if following is None or not trains(following) or ranks_spec(cfg) != ranks_spec(following):
            kill_ranks(cluster)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # never connected: nothing to close
            RayCluster.current().close()


def _same_engines(cfg, following) -> bool:
    """The next stage samples from engines like this stage's (launch/ray_engines.py: they are kept)."""
    from trivium.launch.ray_engines import engines_spec

    return _has_rollout_model(following) and engines_spec(cfg) == engines_spec(following)


def _has_rollout_model(cfg) -> bool:
    """Whether a stage builds a rollout model: it explores, or evaluates (eval task sets)."""
    return cfg.mode in ("both", "explore", "bench", "serve") or bool(cfg.buffer.eval_tasksets)
