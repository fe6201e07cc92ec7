"""The explorer as a Ray actor, and its stand-in in the driver.

With ``cluster.backend: ray`` the explorer's workflows (agents, environments, tools, rewards: the code
most likely to crash or leak) run in an ``ExplorerActor``, not in ``trivium run``. The actor samples from
the run's engine actors through an ``EnginePool`` of its own over the same handles; the driver keeps the
train loop, the buffer and the weight sync, and talks to the actor through ``RemoteExplorer``, which has
the ``Explorer`` interface every loop already uses (``explore_step``, ``evaluate``, ``state_dict``,
``load_state_dict``, ``model``, ``in_flight``).

Exactly once, by construction: a step's experiences come back to the driver as the step's result and
only the driver writes them to the buffer (the in-process queue or ``buffer.storage``). The driver keeps
the explorer's state (task-set position, group-id counter, engines' sampling RNGs) as of the end of the
last step. An explorer actor that dies (SIGKILL, out of memory, a segfaulting environment) is restarted by
Ray (``cluster.max_restarts``); the driver loads that state into the new actor and runs the step again.
Nothing of the dead attempt reached the buffer, and the re-run samples the same tasks with the same RNGs,
so every experience is trained exactly once (and, when no engine died too, the run is the run it would
have been). Restarts are counted in ``rollout/explorer_restarts`` and logged.

Placement: the actor runs on the driver's node (task files, ``failures.jsonl`` and the run folder are
read and written at the same paths as the driver's), with ``cluster.explorer`` resources.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import torch

from trivium.launch.ray_cluster import (
    ClusterError,
    RayCluster,
    Request,
    placement_info,
    placements,
    wait_restarted,
)

log = logging.getLogger(__name__)

__all__ = ["ExplorerActor", "RemoteExplorer"]

_EXPLORERS = itertools.count()  # actor names stay unique within a run's namespace


class _Collected:
    """The actor's stand-in for the buffer: holds a step's experiences until the driver takes them."""

    def __init__(self) -> None:
        self.items: list = []

    def put(self, experiences) -> None:
        self.items.extend(experiences)

    def take(self) -> list:
        items, self.items = self.items, []
        return items


class ExplorerActor:
    """One explorer (a Ray actor): workflows over the run's engine actors, experiences returned per step."""

    def __init__(self, config_json: str, plugin_dir: str, tokenizer, engines: list, meta: dict, failure_log):
        from trivium.config.schema import TriviumConfig
        from trivium.launch import build
        from trivium.launch.ray_cluster import quiet_actor, remember_placements
        from trivium.launch.ray_engines import EnginePool
        from trivium.models.batching import BatchingRolloutModel
        from trivium.validation.load import load_plugins

        quiet_actor()
        remember_placements(meta.get("placed", {}))  # a lost engine node is named here too
        cfg = TriviumConfig.model_validate_json(config_json)
        problems = load_plugins(cfg.plugins, Path(plugin_dir))
        if problems:
            raise RuntimeError(f"explorer actor: {problems[0]}")
        pool = EnginePool(
            cfg.cluster, engines, tokenizer, getattr(torch, meta["dtype"]), meta, meta["version"]
        )
        if meta.get("vision_source"):  # a vision-language policy: image tasks are prepared here
            pool.vision = build.vision_from_folder(cfg, meta["vision_source"])
        self.collected = _Collected()
        taskset = build.train_tasks(cfg)
        self.explorer = build.make_explorer(
            cfg, None, taskset, self.collected, failure_log, model=BatchingRolloutModel(pool)
        )

    def ready(self) -> dict[str, Any]:
        return placement_info()

    def _follow(self, weights: list, version: int) -> None:
        """The driver's newest weights (an object ref in a list, so Ray passes the ref, not the tensors):
        what a restarted engine gets, and the version the experiences are stamped with."""
        self.explorer.model.engine.follow(weights[0], version)

    def explore_step(self, step: int, weights: list, version: int) -> tuple[dict, list, dict]:
        """Step ``step``'s metrics, experiences and the explorer state after it."""
        self._follow(weights, version)
        self.collected.take()  # nothing from an earlier, failed call
        pool = self.explorer.model.engine
        before = pool.restarts
        metrics = self.explorer.explore_step(step)
        metrics["rollout/engine_restarts"] = float(pool.restarts - before)  # this step's (the driver sums)
        return metrics, self.collected.take(), self.explorer.state_dict()

    def evaluate(self, weights: list, version: int) -> tuple[dict, dict]:
        self._follow(weights, version)
        return self.explorer.evaluate(), self.explorer.state_dict()

    def state_dict(self) -> dict:
        return self.explorer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.explorer.load_state_dict(state)

    def in_flight(self) -> list[tuple[str, float]]:
        return self.explorer.in_flight()


class RemoteExplorer:
    """The driver's side of an ``ExplorerActor`` (see the module docstring): the ``Explorer`` interface."""

    def __init__(self, cluster: RayCluster, actor, name: str, model, queue, eval_names: list[str]):
        import ray

        self.cluster, self.actor, self.name = cluster, actor, name
        self.model = model  # the driver's BatchingRolloutModel over the engine pool: syncs go through it
        self.queue = queue
        self.eval_tasksets = eval_names  # only their number is used outside (is there anything to evaluate)
        self.restarts = 0
        self.engine_restarts = 0.0  # engines restarted while the explorer actor sampled from them
        self._state = ray.get(actor.state_dict.remote())  # restored into a restarted actor

    @classmethod
    def start(cls, cluster: RayCluster, cfg, model, queue, failure_log, config_dir: Path, stage: str):
        """The explorer actor of ``stage`` on this node, sampling from ``model``'s engine actors."""
        pool = model.engine
        cluster.check_fits([Request("cluster.explorer", cfg.cluster.explorer, 1)])
        meta = {**pool.meta, "dtype": str(pool.weights_dtype).removeprefix("torch."), "version": pool.version}
        meta["placed"] = placements(pool.actors)
        name = f"{stage}/explorer-{next(_EXPLORERS)}"
        args = (cfg.model_dump_json(), str(config_dir), pool.tokenizer, pool.actors, meta, failure_log)
        actor = cluster.start(
            "explorer",
            ExplorerActor,
            name,
            cfg.cluster.explorer,
            args,
            max_restarts=cfg.cluster.max_restarts,
            on_this_node=True,
        )
        return cls(cluster, actor, name, model, queue, [ts.name for ts in cfg.buffer.eval_tasksets])

    # --- the Explorer interface -------------------------------------------------------------------
    def explore_step(self, step: int) -> dict[str, float]:
        metrics, experiences, state = self._call("explore_step", step)
        self.queue.put(experiences)  # the only write of this step's experiences
        self._state = state
        self.engine_restarts += metrics["rollout/engine_restarts"]
        metrics["rollout/engine_restarts"] = self.engine_restarts + self.model.engine.restarts
        metrics["rollout/explorer_restarts"] = float(self.restarts)
        return metrics

    def evaluate(self) -> dict[str, float]:
        metrics, self._state = self._call("evaluate")
        return metrics

    def state_dict(self) -> dict:
        return self._state

    def load_state_dict(self, state: dict) -> None:
        import ray

        ray.get(self.actor.load_state_dict.remote(state))
        self._state = state

    def in_flight(self) -> list[tuple[str, float]]:
        """The actor's running workflows (answered while a step runs: the actor has several threads)."""
        import ray

        try:
            return ray.get(self.actor.in_flight.remote(), timeout=10)
        except ray.exceptions.RayError as error:
            return [(f"(explorer actor {self.name} does not answer: {type(error).__name__})", 0.0)]

    # --- failures -----------------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        """``method`` of the actor with the newest weights; a dead actor is restarted, given the state of
        the last finished step and called again, up to ``cluster.max_restarts`` times in one call."""
        import ray

        failures = 0
        while True:
            weights, version = self.model.engine.newest()
            try:
                return ray.get(getattr(self.actor, method).remote(*args, [weights], version))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as error:
                failures += 1
                if failures > self.cluster.cfg.max_restarts:
                    raise ClusterError(
                        f"the explorer actor {self.name} died {failures} time(s) in one {method}; "
                        f"cluster.max_restarts={self.cluster.cfg.max_restarts} reached ({type(error).__name__})"
                    ) from error
                self._recover(method, error)

    def _recover(self, method: str, error: BaseException) -> None:
        import ray

        self.restarts += 1
        log.warning(
            "the explorer actor %s died during %s (%s): waiting for its restart",
            self.name,
            method,
            type(error).__name__,
        )
        where = wait_restarted(self.actor, self.cluster.cfg, f"the explorer actor {self.name}", error)
        ray.get(self.actor.load_state_dict.remote(self._state))
        log.warning(
            "the explorer actor %s restarted on node %s (pid %s) with the state of the last finished step: "
            "its %s runs again, nothing of the failed attempt reached the buffer",
            self.name,
            where["node"],
            where["pid"],
            method,
        )
