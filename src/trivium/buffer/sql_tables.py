"""The tables of a ``SqlStorage`` (``storage_sql.py``) and the SQL form of its read policies.

Per storage ``table``: ``{table}`` (one row per experience: status, claim token, use count and last use
step, a few columns worth querying, the record), ``{table}_claims`` (every read: token, consumer, step,
status open | used | committed | released), ``{table}_write_keys`` (idempotent writes) and
``{table}_claim_uses`` (what a used claim changed, to undo it when no checkpoint holds it).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from trivium.buffer.replay import Fifo, ReadPolicy, ReplayPolicy
from trivium.buffer.storage import Status, experience_to_record
from trivium.types import Experience

__all__ = ["row_values", "selection", "tables"]


def selection(rows: sa.Table, policy: ReadPolicy, step: int) -> tuple[list[Any], list[Any], int | None]:
    """WHERE clauses, ORDER BY and the max uses recorded on the claim, for ``policy`` at ``step``."""
    if isinstance(policy, Fifo):
        return [rows.c.status == "ready"], [rows.c.id], 1
    if not isinstance(policy, ReplayPolicy):
        raise TypeError(f"read(policy={policy!r}): use FIFO or a ReplayPolicy (trivium.buffer.replay)")
    where: list[Any] = [rows.c.status == "ready"]
    if policy.max_uses is not None:
        where.append(rows.c.use_count < policy.max_uses)
    # ReplayPolicy.eligible, restated: never used, or used more than cooldown_steps steps ago
    where.append(sa.or_(rows.c.last_use_step.is_(None), rows.c.last_use_step < step - policy.cooldown_steps))
    priority = policy.priority(rows.c.model_version, rows.c.use_count)
    return where, [priority.desc(), rows.c.id], policy.max_uses


def row_values(e: Experience, key: str | None, now: float, status: Status) -> dict[str, Any]:
    record = experience_to_record(e)
    return {
        "status": status,
        "claim_token": None,
        "use_count": 0,
        "last_use_step": None,
        "model_version": int(e.model_version),
        "task_id": str(e.task_id),
        "group_id": int(e.group_id),
        "write_key": key,
        "written_at": now,
        "record_format": record["format"],
        "fields": json.dumps(record["fields"]),
        "tensors": record["tensors"],
    }


def tables(name: str) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table]:
    md = sa.MetaData()
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER only
    rows = sa.Table(
        name,
        md,
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("claim_token", sa.String(64)),
        sa.Column("use_count", sa.Integer, nullable=False),
        sa.Column("last_use_step", sa.BigInteger),
        sa.Column("model_version", sa.BigInteger, nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("group_id", sa.BigInteger, nullable=False),
        sa.Column("write_key", sa.String(255)),
        sa.Column("written_at", sa.Float, nullable=False),  # unix time
        sa.Column("record_format", sa.Integer, nullable=False),
        sa.Column("fields", sa.Text, nullable=False),
        sa.Column("tensors", sa.LargeBinary, nullable=False),
        sa.Index(f"{name}_status_id", "status", "id"),
        sa.Index(f"{name}_claim_token", "claim_token"),
        sa.Index(f"{name}_write_key", "write_key"),
        sa.Index(f"{name}_task_id", "task_id"),  # attach_reward looks rows up by it
        sqlite_autoincrement=True,  # ids are never reused
    )
    claims = sa.Table(
        f"{name}_claims",
        md,
        sa.Column("token", sa.String(64), primary_key=True),
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("max_uses", sa.Integer),  # uses after which a committed row is consumed; NULL: never
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),  # open | used | committed | released
        sa.Column("claimed_at", sa.Float, nullable=False),
        sa.Column("closed_at", sa.Float),
        sa.Index(f"{name}_claims_consumer", "consumer", "status"),
    )
    keys = sa.Table(
        f"{name}_write_keys",
        md,
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("written_at", sa.Float, nullable=False),
    )
    uses = sa.Table(  # what a used claim changed, to undo it when no checkpoint holds it (recover)
        f"{name}_claim_uses",
        md,
        sa.Column("token", sa.String(64), primary_key=True),
        sa.Column("row_id", sa.BigInteger, primary_key=True),
        sa.Column("last_use_step_before", sa.BigInteger),
    )
    return rows, claims, keys, uses
