"""``check-config`` asks the Ray cluster a config joins (``cluster.address``) whether each stage's actors
fit it: a short-lived driver reads the cluster's totals and nodes, ``validation.cluster_fit`` judges.
Here because only ``launch/`` imports Ray."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

from trivium.validation.cluster_fit import describe, field_value, misfits, stage_requests

__all__ = ["probe", "reachable_cluster_problems"]


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
                    field_value(cfg, m.field),
                    m.message,
                    f"lower {m.field} or the counts (explorer.engine_num, trainer.world_size), or add nodes "
                    "(`ray start --address ...`)",
                )
            )
    return problems, notes
