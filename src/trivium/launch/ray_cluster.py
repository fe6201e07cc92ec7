"""The Ray side of ``cluster.backend: ray``: connecting, checking that requests fit, placing actors.

``trivium run`` stays the driver: it runs the train loop, the buffer and the weight sync, and places the
other roles as Ray actors: the explorer (``ray_explorer.py``, on the driver's node), every rollout engine
(``ray_engines.py``) and every trainer rank (``ray_trainer.py``, one placement-group bundle each). Only
``launch/`` imports Ray.

Placement never hangs silently:
- before anything starts, every request (``cluster.engine`` x ``explorer.engine_num``, ``cluster.trainer_rank``
  x ``trainer.world_size``, ``cluster.explorer``) is checked against the cluster's totals and its largest node; a request that
  cannot fit is a ``ClusterError`` naming the config field and what the cluster has;
- a placement group or an actor that is not ready within ``cluster.start_timeout_s`` (still PENDING: the
  cluster is busy, or a node went away) is an error naming it, its request and what is free;
- where each actor landed (node, pid) is logged, with a warning when Ray runs it at a lowered CPU priority.

Ray starts its worker processes at niceness 15 (``RAY_worker_niceness``), so on a node that also runs
anything else at normal priority (another run, a data job, a test suite) trivium's engines and ranks get only
the CPU time left over: a one-step run took minutes instead of seconds beside two busy processes on 2 cores.
A cluster trivium starts itself runs its workers at niceness 0; one started with ``ray start`` keeps Ray's
default unless started with ``RAY_worker_niceness=0`` (docs/cluster.md), and the placement log says so.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trivium.validation.cluster_fit import Request, describe, misfits, stage_requests

log = logging.getLogger(__name__)

__all__ = ["ClusterError", "RayCluster", "Request", "stage_requests"]

_CURRENT: RayCluster | None = None
# actor id -> where it last started (``placement_info``): what ``lost_node`` compares with the live nodes.
# Per process: the driver fills it as it places actors, and hands its engines' entries to the explorer actor
# (``placements``, ``remember_placements``), which waits for a restarted engine itself.
_PLACED: dict[str, dict[str, Any]] = {}
# Ray logs an error-level line for every process that starts an actor with max_restarts > 0 and arguments
# in the object store, whether or not anything holds them; here something does.
RESTART_LINE_EXPLAINED = (
    "Ray: the line 'core_worker.cc: Actor ... has constructor arguments in the object store and max_restarts > "
    "0' is expected and harmless here: this driver holds the arguments of each restartable actor (rollout "
    "engines, explorer) for the actor's life, so a restart finds them (docs/cluster.md)"
)
WORKER_NICENESS_ENV = "RAY_worker_niceness"


class ClusterError(RuntimeError):
    """A request the Ray cluster cannot serve (does not fit, not placed in time, died while starting)."""


@dataclass
class RayCluster:
    """This driver's connection to Ray, and the actors it started (by role), killed with their stage."""

    cfg: Any  # ClusterConfig
    namespace: str
    started_here: bool
    actors: dict[str, list[Any]] = field(default_factory=dict)
    groups: dict[str, list[Any]] = field(default_factory=dict)  # placement groups, by role
    held: dict[str, list[Any]] = field(default_factory=dict)  # restartable actors' arguments, by role
    # actors created ahead of their use and not waited for yet, by role: {role: (what they are, Launch)}
    launched: dict[str, tuple[Any, Launch]] = field(default_factory=dict)
    explained_restart_line: bool = False

    @classmethod
    def connect(cls, cfg, config_dir: Path) -> RayCluster:
        """Join (``cluster.address``) or start Ray for this run; one connection per process."""
        global _CURRENT
        import ray

        if _CURRENT is not None:
            return _CURRENT
        c = cfg.cluster
        namespace = c.namespace or f"trivium/{cfg.project}/{cfg.name}"
        # actors import the user's plugins and module:attr parts from the same places as this process
        paths = [
            str(Path(config_dir).resolve()),
            os.getcwd(),
            *os.environ.get("PYTHONPATH", "").split(os.pathsep),
        ]
        env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "TOKENIZERS_PARALLELISM": "false"}
        options = {
            "namespace": namespace,
            "runtime_env": {"env_vars": env},
            "include_dashboard": False,
            "log_to_driver": True,
            "configure_logging": False,
        }
        if c.address is None:
            # the raylet this starts reads it from this process's environment (module docstring)
            os.environ.setdefault(WORKER_NICENESS_ENV, "0")
            ray.init(num_cpus=os.cpu_count(), **options)
        else:
            try:
                ray.init(address=c.address, **options)
            except ConnectionError as error:
                raise ClusterError(
                    f"cluster.address={c.address!r}: no Ray cluster there ({error}). Start one with `ray start "
                    "--head`, give its HOST:PORT, or leave cluster.address empty to start Ray for this run"
                ) from error
        total = ray.cluster_resources()
        log.info(
            "Ray: %s cluster at %s, namespace %s: %s",
            "a new" if c.address is None else "joined the",
            ray.get_runtime_context().gcs_address,
            namespace,
            describe(total),
        )
        _CURRENT = cls(c, namespace, c.address is None)
        return _CURRENT

    @staticmethod
    def current() -> RayCluster:
        if _CURRENT is None:
            raise RuntimeError("cluster.backend ray: Ray is not connected (RayCluster.connect first)")
        return _CURRENT

    # --- what fits -------------------------------------------------------------------------------
    def check_fits(self, requests: Sequence[Request]) -> None:
        """Raise ``ClusterError`` when the requests cannot fit into the cluster as it is: the sum over the
        totals, and each single actor into its largest node (``validation.cluster_fit``, the check that
        ``check-config`` runs before a run)."""
        import ray

        nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
        found = misfits(requests, dict(ray.cluster_resources()), nodes)
        if found:
            first = found[0]
            raise ClusterError(
                f"{first.field}: {first.message}. Lower {first.field} or the counts (explorer.engine_num, "
                "trainer.world_size), or add a node with `ray start --address ...`"
            )

    # --- placing -----------------------------------------------------------------------------------
    def placement_group(self, role: str, name: str, bundles: list[dict[str, float]], field_name: str):
        """A placement group of ``bundles`` (packed on as few nodes as possible), ready, or ``ClusterError``;
        removed with ``kill(role)``."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        free = ray.available_resources()
        short = {k: v for k, v in _sum(bundles).items() if v > free.get(k, 0.0) + 1e-9}
        if short:
            log.warning(
                "Ray: %s needs %s, which is not free now (free: %s): waiting up to %g s for it",
                name,
                describe(short),
                describe(free),
                self.cfg.start_timeout_s,
            )
        group = placement_group(bundles, strategy="PACK", name=f"{name}@{os.getpid()}")
        try:
            ray.get(group.ready(), timeout=self.cfg.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise ClusterError(
                f"{field_name}: the placement group {name} ({len(bundles)} bundle(s) of {bundles[0]}) was not "
                f"placed within cluster.start_timeout_s={self.cfg.start_timeout_s:g} s; free now: "
                f"{describe(ray.available_resources())}. Is another run holding the resources?"
            ) from None
        self.groups.setdefault(role, []).append(group)
        return group

    def start(self, role: str, cls: type, name: str, resources, args: Sequence[Any], *,
              max_restarts: int = 0, on_this_node: bool = False) -> Any:  # fmt: skip
        """Start actor ``name`` (class ``cls``, a plain class made remote here) and wait until it answers
        ``ready()``; returns its handle. ``on_this_node``: on the driver's node (it reads and writes the
        driver's files)."""
        (actor,) = self.start_many(
            role, cls, resources, [(name, args)], max_restarts=max_restarts, on_this_node=on_this_node
        )
        return actor

    def start_many(self, role: str, cls: type, resources, named_args: Sequence[tuple[str, Sequence[Any]]], *,
                   group=None, max_restarts: int = 0, on_this_node: bool = False) -> list[Any]:  # fmt: skip
        """Start one actor of class ``cls`` per ``(name, constructor arguments)`` of ``named_args``, all at once
        (each in its own process, so their imports and model builds overlap: a pool of N engines starts in
        about the time of one where the cluster has the cores), and wait until every one answers ``ready()``
        within one ``cluster.start_timeout_s``; their handles, in order. ``group``: actor i in bundle i of
        that placement group. When one does not start, none is kept: the error names the first that failed."""
        return self.launch_many(
            role,
            cls,
            resources,
            named_args,
            group=group,
            max_restarts=max_restarts,
            on_this_node=on_this_node,
        ).wait()

    def launch_many(self, role: str, cls: type, resources, named_args: Sequence[tuple[str, Sequence[Any]]], *,
                    group=None, max_restarts: int = 0, on_this_node: bool = False) -> Launch:  # fmt: skip
        """``start_many`` without the wait: the actors are created (their processes start, import and build
        while this process goes on) and ``Launch.wait()`` waits for them. ``cluster.start_timeout_s`` counts
        from here. Until then they are this role's actors already: ``kill(role)`` and ``close()`` stop them."""
        import ray
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        options: dict[str, Any] = {
            "num_cpus": resources.num_cpus,
            "num_gpus": resources.num_gpus,
            "max_restarts": max_restarts,
            "max_concurrency": 4,  # a weight update or a checksum may come while a batch runs
        }
        if resources.memory_gb > 0:
            options["memory"] = int(resources.memory_gb * 2**30)
        if resources.resources:  # custom resources: on the nodes that have them (`ray start --resources`)
            options["resources"] = dict(resources.resources)
        if on_this_node:
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        pending = []
        for i, (name, args) in enumerate(named_args):
            placed = dict(options, name=f"{name}@{os.getpid()}")
            if group is not None:
                placed["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, i)
            remote_cls = cls
            if max_restarts > 0:
                # Ray restarts the actor with the arguments it was created with: they are put in the object
                # store here and held for the actor's life, so that a restart finds them (a large argument
                # passed bare is put there by Ray and may go out of scope: ray-project/ray#53727).
                held = ray.put(tuple(args))
                self.held.setdefault(role, []).append(held)
                remote_cls, args = _taking_held_args(cls), ([held],)
            actor = ray.remote(remote_cls).options(**placed).remote(*args)
            pending.append((name, actor, actor.ready.remote()))
        if max_restarts > 0 and not self.explained_restart_line:  # after Ray's line
            self.explained_restart_line = True
            log.info(RESTART_LINE_EXPLAINED)
        self.actors.setdefault(role, []).extend(actor for _, actor, _ in pending)
        return Launch(self, role, resources, pending, time.monotonic() + self.cfg.start_timeout_s)

    def kill(self, role: str) -> None:
        """Kill the actors of ``role`` this driver started (at the end of their stage)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        self.launched.pop(role, None)
        for actor in self.actors.pop(role, []):
            ray.kill(actor)
        for group in self.groups.pop(role, []):
            remove_placement_group(group)
        self.held.pop(role, None)

    def close(self) -> None:
        global _CURRENT
        import ray

        for role in {*self.actors, *self.groups}:
            self.kill(role)
        if self.started_here:
            ray.shutdown()
        _PLACED.clear()
        _CURRENT = None


@dataclass
class Launch:
    """Actors of one ``RayCluster.launch_many``, created and not waited for yet."""

    cluster: RayCluster
    role: str
    resources: Any  # the cluster section they asked with (``ActorResources``)
    pending: list[tuple[str, Any, Any]]  # (name, actor, its ready() reference)
    deadline: float  # time.monotonic() by which each must answer ready()

    def wait(self) -> list[Any]:
        """Wait until every actor answers ``ready()`` (by the deadline: ``cluster.start_timeout_s`` from the
        launch), log where each landed, and return their handles in order. When one does not start, every
        one is killed and ``ClusterError`` names the first that failed."""
        import ray

        placed_at = []
        for name, _, ready in self.pending:
            try:
                placed_at.append(ray.get(ready, timeout=max(0.0, self.deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError:
                self._kill_all()
                raise ClusterError(
                    f"actor {name} ({describe(_asks(self.resources))}) did not start within "
                    f"cluster.start_timeout_s={self.cluster.cfg.start_timeout_s:g} s (still PENDING, or too slow "
                    f"to load); free now: {describe(ray.available_resources())}"
                ) from None
            except ray.exceptions.RayError as error:
                self._kill_all()
                raise ClusterError(f"actor {name} failed while starting: {_first_line(error)}") from error
        actors = []
        for (name, actor, _), where in zip(self.pending, placed_at, strict=True):
            log.info(
                "Ray: placed %s on node %s %s (pid %s)",
                name,
                where["node"],
                where["node_id"][:12],
                where["pid"],
            )
            _PLACED[actor._actor_id.hex()] = where
            warning = priority_warning(name, where)
            if warning:
                log.warning(warning)
            actors.append(actor)
        return actors

    def _kill_all(self) -> None:
        """The actors of a launch that did not all start: none is left running, or left among the role's."""
        import ray

        mine = {id(actor) for _, actor, _ in self.pending}
        for _, actor, _ in self.pending:
            ray.kill(actor)
        kept = [a for a in self.cluster.actors.get(self.role, []) if id(a) not in mine]
        self.cluster.actors[self.role] = kept


@functools.cache
def _taking_held_args(cls: type) -> type:
    """``cls`` whose constructor takes ``[ref]``, a reference to its arguments in the object store (inside
    a list, so that Ray passes the reference itself rather than the object it names)."""

    class TakingHeldArgs(cls):  # type: ignore[valid-type, misc]
        def __init__(self, boxed: list[Any]):
            import ray

            super().__init__(*ray.get(boxed[0]))

    TakingHeldArgs.__name__, TakingHeldArgs.__qualname__ = cls.__name__, cls.__qualname__
    return TakingHeldArgs


def wait_restarted(actor, cfg, what: str, error: BaseException) -> dict[str, Any]:
    """Wait for Ray to restart ``actor`` (``what`` names it) after ``error``; its ``ready()`` answer.
    ``ClusterError`` when it is not back within ``cluster.start_timeout_s`` or Ray gave up on it, saying
    whether its node left the cluster (a lost node: no other node may have room for the actor)."""
    import ray

    deadline = time.monotonic() + cfg.start_timeout_s
    lost = lost_node(actor)
    if lost:
        log.warning(
            "%s: %s; waiting up to %g s for Ray to start it elsewhere", what, lost, cfg.start_timeout_s
        )
    while True:  # "unavailable" while Ray restarts it; "died" once it gave up
        try:
            where = ray.get(actor.ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise ClusterError(_not_back(what, cfg, lost_node(actor))) from error
            time.sleep(0.5)
            continue
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(_not_back(what, cfg, lost_node(actor))) from error
        except ray.exceptions.RayError as again:
            raise ClusterError(f"{what} did not come back after dying: {again}. {RESUME}") from again
        _PLACED[actor._actor_id.hex()] = where
        return where


RESUME = (
    "The run stops here; `trivium run` again, once the cluster has room for it, resumes from the newest "
    "checkpoint (trainer.save_interval)"
)


def _not_back(what: str, cfg, lost: str) -> str:
    why = f" ({lost}, and no other node has room for it)" if lost else ""
    return f"{what} was not restarted within cluster.start_timeout_s={cfg.start_timeout_s:g} s{why}. {RESUME}"


def placements(actors: list[Any]) -> dict[str, dict[str, Any]]:
    """Where each of ``actors`` last started, as this process knows it (for ``remember_placements``)."""
    return {a._actor_id.hex(): _PLACED[a._actor_id.hex()] for a in actors if a._actor_id.hex() in _PLACED}


def remember_placements(placed: dict[str, dict[str, Any]]) -> None:
    """In an actor that waits for other actors' restarts (the explorer's engines): where they started, as
    the driver saw it, so that a lost node is named here too."""
    _PLACED.update(placed)


def lost_node(actor) -> str:
    """'it ran on node IP ID, which has left the cluster' when the node ``actor`` last started on is no
    longer alive, else ''."""
    import ray

    where = _PLACED.get(actor._actor_id.hex())
    if not where:
        return ""
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    if where["node_id"] in alive:
        return ""
    return f"it ran on node {where['node']} {where['node_id'][:12]}, which has left the cluster"


def quiet_actor() -> None:
    """In an actor: no progress bars (checkpoint writes would print one per rank into the driver's log)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()


def priority_warning(name: str, where: dict[str, Any]) -> str | None:
    """What to say when Ray runs actor ``name`` (``placement_info()`` in ``where``) at a lowered priority."""
    if where.get("niceness", 0) <= 0:
        return None
    return (
        f"Ray runs {name} at niceness {where['niceness']} (Ray's default for its workers): beside other work on "
        f"node {where['node']} it gets only the CPU time left over, and may not start within "
        f"cluster.start_timeout_s. Start the cluster with {WORKER_NICENESS_ENV}=0 in the environment "
        f"(`{WORKER_NICENESS_ENV}=0 ray start ...`; docs/cluster.md)"
    )


def placement_info() -> dict[str, Any]:
    """Where the calling actor runs: for ``ready()``."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()  # several nodes may share an IP (one machine)
    return {
        "node": ray.util.get_node_ip_address(),
        "node_id": node_id,
        "pid": os.getpid(),
        "niceness": os.nice(0),
    }


def _asks(resources) -> dict[str, float]:
    return Request("", resources, 1).amounts()


def _sum(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for bundle in bundles:
        for k, v in bundle.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[-1][:300]
