"""Whether a stage's Ray actors fit a cluster: the one check behind ``check-config`` (before anything
starts) and ``RayCluster.check_fits`` (right after connecting, against the live cluster).

With ``cluster.backend: ray`` the cluster decides, not the machine ``check-config`` runs on: a stage asks
for ``cluster.engine`` x ``explorer.engine_num``, ``cluster.explorer`` x 1 and ``cluster.trainer_rank`` x
``trainer.world_size``, and those must fit the cluster's totals, each actor into its largest node.
``cluster.address`` empty starts Ray on this machine, so that cluster is this machine (``this_machine``);
an address is asked (``probe``) where it can be reached, and left to the run where it cannot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GIB = 2**30


@dataclass
class Request:
    """``count`` actors of ``resources`` (``ActorResources``), asked for by the config field ``field``."""

    field: str
    resources: Any
    count: int

    def amounts(self) -> dict[str, float]:
        r = self.resources
        out = {"CPU": r.num_cpus, "GPU": r.num_gpus, "memory": r.memory_gb * GIB}
        out.update(r.resources)  # custom resources (`ray start --resources`): where it may run
        return {k: v for k, v in out.items() if v > 0}


@dataclass(frozen=True)
class Misfit:
    """A request that cannot fit: the config field to change, and why, with what the cluster has."""

    field: str
    message: str


def stage_requests(cfg) -> list[Request]:
    """What a stage of mode ``cfg.mode`` places: engines where it samples or evaluates, the explorer actor
    where it explores, trainer ranks where it trains."""
    explores = cfg.mode in ("both", "explore")
    out = []
    if explores or cfg.buffer.eval_tasksets or cfg.mode == "bench":
        out.append(Request("cluster.engine", cfg.cluster.engine, cfg.explorer.engine_num))
    if explores:
        out.append(Request("cluster.explorer", cfg.cluster.explorer, 1))
    if cfg.mode in ("both", "train"):
        out.append(Request("cluster.trainer_rank", cfg.cluster.trainer_rank, cfg.trainer.world_size))
    return out


def misfits(
    requests: Sequence[Request],
    total: dict[str, float],
    nodes: list[dict[str, float]],
    where: str = "the cluster",
) -> list[Misfit]:
    """Each request that cannot fit ``total`` (summed over the requests) or whose single actor fits no node
    of ``nodes`` (each a node's resources); ``where`` names the cluster in the messages."""
    out, need = [], {}
    for req in requests:
        for key, amount in req.amounts().items():
            need[key] = need.get(key, 0.0) + amount * req.count
            largest = max((n.get(key, 0.0) for n in nodes), default=0.0)
            if amount > largest + 1e-9:
                out.append(
                    Misfit(
                        req.field,
                        f"each actor asks for {amount_text(key, amount)}, but no node of {where} has that much "
                        f"(the largest has {amount_text(key, largest)}; {where}: {describe(total)})",
                    )
                )
    for key, amount in need.items():
        if amount > total.get(key, 0.0) + 1e-9:
            asked = [r for r in requests if key in r.amounts()]
            parts = ", ".join(f"{r.field} {r.count} x {amount_text(key, r.amounts()[key])}" for r in asked)
            out.append(
                Misfit(
                    asked[-1].field,
                    f"the run asks for {amount_text(key, amount)} in all ({parts}), {where} has "
                    f"{amount_text(key, total.get(key, 0.0))} ({describe(total)})",
                )
            )
    return out


def this_machine() -> dict[str, float]:
    """The one-node cluster ``cluster.address`` empty starts: Ray with every core of this machine, its
    CUDA devices and its memory."""
    import torch

    out = {"CPU": float(os.cpu_count() or 1)}
    if torch.cuda.is_available():
        out["GPU"] = float(torch.cuda.device_count())
    with contextlib.suppress(ValueError, OSError, AttributeError):  # not POSIX: no memory check
        out["memory"] = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return out


def probe(address: str) -> tuple[dict[str, float], list[dict[str, float]]] | str:
    """(totals, each live node's resources) of the Ray cluster at ``address``, or why it could not be asked
    (not installed, not reachable). Connects as a short-lived driver and disconnects."""
    try:
        import ray
    except ImportError:
        return "the ray package is not installed here"
    if ray.is_initialized():
        return "this process is already connected to a Ray cluster"
    reached = _reachable(address)
    if reached is not True:
        return reached
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as error:  # ConnectionError, or Ray's own for a bad address
        return f"no Ray cluster answered there ({str(error).strip().splitlines()[-1][:200]})"
    try:
        total = dict(ray.cluster_resources())
        nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    finally:
        ray.shutdown()
    return total, nodes


def _reachable(address: str, timeout_s: float = 3.0) -> bool | str:
    """True when something listens at the cluster's address (Ray itself waits a minute or more for an
    address where nothing answers); else why not. 'auto' is the cluster this machine belongs to."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if not address and current.is_file():
            address = current.read_text().strip()
        if not address:
            return "no Ray cluster runs on this machine (no RAY_ADDRESS, no `ray start` here)"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError) as error:
        return f"nothing answers at {address} ({error})"


def amount_text(key: str, value: float) -> str:
    return f"{value / GIB:.1f} GiB memory" if key == "memory" else f"{value:g} {key}"


def describe(resources: dict[str, float]) -> str:
    """CPU, GPU, memory and any custom resources, e.g. '8 CPU, 1 GPU, 30.0 GiB memory, 1 node:b'."""
    keys = [k for k in ("CPU", "GPU", "memory") if k in resources]
    keys += sorted(
        k for k in resources if k not in ("CPU", "GPU", "memory", "object_store_memory") and _custom(k)
    )
    return ", ".join(amount_text(k, resources[k]) for k in keys) or "nothing"


def _custom(key: str) -> bool:
    """A resource the user defined (``ray start --resources``), not one Ray adds per node or per IP."""
    return not key.startswith(("node:", "accelerator_type:", "bundle_group_"))


def local_cluster_problems(cfg, at) -> list:
    """A stage with ``cluster.backend: ray`` and no ``cluster.address`` starts Ray on this machine: its
    requests must fit this machine (the run would refuse them right after starting Ray)."""
    from trivium.config.errors import Problem

    c = cfg.cluster
    if c.backend != "ray" or c.address is not None:
        return []
    machine = this_machine()
    where = "this machine (cluster.address is empty: Ray starts here)"
    return [
        Problem(
            at(m.field),
            _value(cfg, m.field),
            m.message,
            f"lower {m.field} or the counts, or join a larger cluster with cluster.address (docs/cluster.md)",
        )
        for m in misfits(stage_requests(cfg), machine, [machine], where)
    ]


def reachable_cluster_problems(run_cfg) -> tuple[list, list[str]]:
    """For the stages that join a cluster (``cluster.address`` set): their requests against that cluster,
    asked once per address. Returns (problems, notes): a cluster that cannot be reached here is a note
    (``check-config`` may run on a laptop, away from the cluster), not a problem."""
    from trivium.config.errors import Problem, join_path

    problems, notes, asked = [], [], {}
    for i, stage in enumerate(run_cfg.stages):
        cfg = stage.config
        if cfg.cluster.backend != "ray" or cfg.cluster.address is None:
            continue
        address = cfg.cluster.address
        if address not in asked:
            asked[address] = probe(address)
            if isinstance(asked[address], str):
                notes.append(
                    f"cluster.address={address!r}: {asked[address]}, so the stages' Ray requests were not "
                    "checked against it (the run checks them right after connecting)"
                )
            else:
                total, nodes = asked[address]
                notes.append(f"cluster.address={address!r}: {len(nodes)} node(s), {describe(total)}")
        if isinstance(asked[address], str):
            continue
        total, nodes = asked[address]
        prefix = join_path("stages", i) if run_cfg.config.stages else ""
        for m in misfits(stage_requests(cfg), total, nodes, f"the cluster at {address}"):
            problems.append(
                Problem(
                    join_path(prefix, m.field) if prefix else m.field,
                    _value(cfg, m.field),
                    m.message,
                    f"lower {m.field} or the counts (explorer.engine_num, trainer.world_size), or add nodes "
                    "(`ray start --address ...`)",
                )
            )
    return problems, notes


def _value(cfg, field: str) -> Any:
    section = getattr(cfg.cluster, field.split(".")[-1])
    return section.model_dump(exclude_defaults=True) or section.model_dump()
