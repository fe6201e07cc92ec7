"""Whether a stage's Ray actors fit a cluster: the one check behind ``check-config`` (before anything
starts) and ``RayCluster.check_fits`` (right after connecting, against the live cluster).

With ``cluster.backend: ray`` the cluster decides, not the machine ``check-config`` runs on: a stage asks
for ``cluster.engine`` x ``explorer.engine_num``, ``cluster.explorer`` x 1 and ``cluster.trainer_rank`` x
``trainer.world_size``, and those must fit the cluster's totals, each actor into its largest node.
``cluster.address`` empty starts Ray on this machine, so that cluster is this machine (``this_machine``);
an address is asked by ``launch/ray_probe.py`` (only ``launch/`` imports Ray) where it can be reached.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
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
            field_value(cfg, m.field),
            m.message,
            f"lower {m.field} or the counts, or join a larger cluster with cluster.address (docs/cluster.md)",
        )
        for m in misfits(stage_requests(cfg), machine, [machine], where)
    ]


def field_value(cfg, field: str) -> Any:
    section = getattr(cfg.cluster, field.split(".")[-1])
    return section.model_dump(exclude_defaults=True) or section.model_dump()
