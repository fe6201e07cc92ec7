"""Where a run's roles run (``cluster.backend``), behind one seam, so that no caller tests a backend's name.

``Placement`` is what the driver asks of a backend: open before the first stage (and check that every
stage's actors fit), a stage's rollout engines, the explorer of a task set, a stage's trainer (its processes
launched first, so that they load while the rest starts), whether one
process holds the whole model (trajectory records need it), what ends with a stage, and close at the end.
``local`` (here) runs everything in this process and the rank processes it starts (``ranks.py``); ``ray``
(``ray_placement.py``) places engines, explorer and trainer ranks as Ray actors. ``PLACEMENTS`` holds them
by ``cluster.backend``'s name and loads its built-ins on first use: this module never imports Ray's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from trivium.launch import build
from trivium.registry import Registry
from trivium.trainer.parallel import STRATEGIES

log = logging.getLogger(__name__)

__all__ = ["PLACEMENTS", "ExplorerHandle", "LocalPlacement", "Placement", "placement_of", "start_explorer"]


class ExplorerHandle(Protocol):
    """What the loops ask of an explorer: an ``explorer.Explorer`` in this process, or the driver's
    ``ray_explorer.RemoteExplorer`` over an explorer actor (``Placement.explorer`` returns one)."""

    model: Any  # the rollout model it samples from (weight syncs load into it)

    def explore_step(self, step: int) -> dict[str, float]: ...

    def evaluate(self) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def in_flight(self) -> list[tuple[str, float]]: ...


class Placement(Protocol):
    engines_in_driver: bool  # whether the rollout engines share the driver's process (its memory)

    def open(self, run_cfg, config_dir: Path) -> None:
        """Before the first stage: connect to what runs the roles, and check that every stage fits."""

    def rollout_engine(self, policy, tokenizer, cfg, version: int, *, weights: str = "copy") -> Any:
        """The stage's batching rollout model; ``weights``: copy, take or share the policy's (engines in this
        process: ``build.build_rollout_model`` says what each means; engines elsewhere load copies)."""

    def explorer(
        self, cfg, state, model, taskset=None, queue=None, failure_log: Path | None = None
    ) -> ExplorerHandle:
        """The explorer of ``taskset`` sampling from ``model`` (an evaluation-only one without a task set)."""

    def launch_trainer(self, stage, config_dir: Path) -> None:
        """Start the processes of ``stage``'s trainer ahead, without waiting for them, where they are
        processes of their own: they load while the rollout engines and the explorer start, and ``trainer``
        waits for them. Called first thing in a stage that trains; a no-op where there is nothing to start."""

    def trainer(self, stage, run_dir: Path, state, total: int) -> contextlib.AbstractContextManager:
        """The stage's trainer over ``state.model``, stopped when the stage ends."""

    def holds_whole_model(self, cfg) -> bool:
        """Whether one process of this run holds the whole model (``monitor.trajectories`` records there)."""

    def end_stage(self, cfg, following) -> None:
        """After stage ``cfg`` (``following``: the next stage's config, or None): stop what ends with it."""

    def close(self) -> None:
        """After the last stage, failed or not."""


PLACEMENTS: Registry[type] = Registry(
    "placement",
    doc="a class with the methods of trivium.launch.placement.Placement",
    check=lambda obj: None if isinstance(obj, type) else f"is a {type(obj).__name__}, not a class",
    builtins=["trivium.launch.ray_placement"],
)


def placement_of(cfg) -> Placement:
    """The placement of ``cluster.backend``."""
    return PLACEMENTS.get(cfg.cluster.backend)()


def start_explorer(cfg, state, taskset=None, queue=None, failure_log: Path | None = None) -> Any:
    """The stage's explorer over rollout engines of ``state.model``, both where ``cluster.backend`` puts
    them; without ``taskset``, an evaluation-only explorer."""
    place = placement_of(cfg)
    why_copy = build.why_rollout_copies_weights(cfg)  # "": the engine samples from the trainer's weights
    if why_copy:
        log.debug("rollout engine: weights of its own (%s)", why_copy)
    weights = "copy" if why_copy else "share"
    model = place.rollout_engine(state.model, state.tokenizer, cfg, state.version, weights=weights)
    return place.explorer(cfg, state, model, taskset, queue, failure_log)


@PLACEMENTS.register("local")
class LocalPlacement:
    """Every role in this process; ``trainer.world_size`` > 1 adds rank processes on this machine."""

    engines_in_driver = True

    def open(self, run_cfg, config_dir: Path) -> None:
        pass

    def rollout_engine(self, policy, tokenizer, cfg, version: int, *, weights: str = "copy") -> Any:
        return build.build_rollout_model(policy, tokenizer, cfg, version, weights=weights)

    def explorer(self, cfg, state, model, taskset=None, queue=None, failure_log: Path | None = None) -> Any:
        return build.make_explorer(cfg, state, taskset, queue, failure_log, model=model)

    def launch_trainer(self, stage, config_dir: Path) -> None:
        pass  # rank processes start in trainer(): FSDP2 shards the model in place after the explorer copied it

    @contextlib.contextmanager
    def trainer(self, stage, run_dir: Path, state, total: int) -> Iterator[Any]:
        """On this process alone (``trainer.strategy: single``), or rank 0 of ``trainer.world_size`` ranks: the
        stage before's when they are like this stage's, else ranks it starts (``ranks.py``); a failed stage
        stops them. After a multi-rank stage, the next stage starts from a plain (unsharded) model: its last
        checkpoint."""
        cfg = stage.config
        pad = state.tokenizer.pad_token_id
        if not STRATEGIES.get(cfg.trainer.strategy).multi_rank:
            yield build.make_trainer(cfg, state.model, pad, total)
            return
        from trivium.launch.ranks import LeaderTrainer, RankGroup

        ranks = RankGroup.for_stage(cfg, stage.name, run_dir, state.config_dir)
        try:
            ranks.share_model(state.model, pad, total)
            yield LeaderTrainer(build.make_trainer(cfg, state.model, pad, total, ranks.parallel), ranks)
        except BaseException:
            ranks.close()
            raise
        ranks.release()  # kept for a next stage that trains on ranks like them (end_stage)
        final = run_dir / "checkpoints" / stage.name / f"step_{total}" / "model"
        state.model, _ = build.load_policy(str(final), cfg)

    def holds_whole_model(self, cfg) -> bool:
        return not STRATEGIES.get(cfg.trainer.strategy).shards_parameters  # single, and ddp's rank 0

    def end_stage(self, cfg, following) -> None:
        from trivium.launch.ranks import keep_ranks_for

        keep_ranks_for(following)

    def close(self) -> None:
        from trivium.launch.ranks import keep_ranks_for

        keep_ranks_for(None)
