"""Experience storage in SQL through SQLAlchemy Core: a SQLite file (the default, in the run folder) or
PostgreSQL by URL (``postgresql+psycopg2://user:password@host:5432/db``).

Design decisions:
- One row per experience: its status (``ready`` → ``claimed`` → ``consumed``, or back to ``ready`` under
  a replay policy), the claim token holding it, its use count and last-use step, a few columns worth
  querying (model version, task, group, write key) and the record of ``storage.py`` (fields as JSON
  text, tensors as one safetensors blob). JSON lives in a TEXT column, not PostgreSQL's ``json`` type,
  because that type refuses the NaN a metric may hold.
- The tables and the SQL form of the read policies live in ``sql_tables.py``.
- A claims table records every read (token, consumer, step, size, open/used/committed/released): it is
  what ``use``, ``commit`` and ``recover`` act on, what makes them idempotent, and the default step clock.
- Uses count when the trainer has trained on a claim (``use``), not when a checkpoint holds it, so a
  replay policy serves the rows again within a run at any checkpoint interval. ``use`` records each
  row's last use step before it in ``{table}_claim_uses``; ``recover`` undoes the used claims no
  checkpoint committed, newest first, so a resumed run sees the use counts its model was trained with.
- Claims are atomic across processes. SQLite: every transaction takes the write lock up front
  (``BEGIN IMMEDIATE``, WAL, see ``sql_engine.py``). PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED``,
  so concurrent readers take disjoint rows without waiting for each other.
- FIFO order is id order. With several concurrent writers on PostgreSQL a smaller id can commit after a
  larger one and be served after it; nothing is lost or served twice.
- Delayed rewards: a pending row has status ``pending``, which no read selects (serve mode writes its
  reward as NaN). ``attach_reward`` finds the rows by the ``task_id`` column (a served call's id;
  indexed), rewrites the reward in their record and sets them ``ready`` in one transaction, under the
  same locks as a claim. A pending row rewarded late keeps its id, so FIFO serves it before rows written
  after it. Databases written before this index existed get it when opened; their rows read as before.

- A PostgreSQL server that restarts (or a network that drops) costs a wait, not the run: every operation
  is one transaction, retried on a lost connection for up to ``reconnect_s`` (120 s). A retry is safe:
  an aborted transaction changed nothing; one whose commit landed before the connection dropped is found
  again (a claim by its token, made before the first try; a keyed write by its key; a commit is
  idempotent; recover finds nothing left to release). Two cases stay ambiguous: a write without a key
  (serve mode's calls) may then be stored twice, and ``attach_reward`` answers ``RewardConflict``.

Left out: other databases (MySQL would need testing of its locking), schema migrations (the tables carry
a record format number; a new format needs a new reader, not an ALTER), SQLite on network filesystems
(WAL needs shared memory on one host; use PostgreSQL across machines).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from trivium.buffer.replay import FIFO, ReadPolicy
from trivium.buffer.sql_engine import PG_RECONNECT_S, create_engine, explain, parse_url
from trivium.buffer.sql_tables import row_values, selection, tables
from trivium.buffer.storage import (
    STATUSES,
    Claim,
    RewardConflict,
    Status,
    StorageError,
    UnknownExperience,
    json_safe,
    record_to_experience,
)
from trivium.types import Experience

__all__ = ["SqlStorage"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")


class SqlStorage:
    """``ExperienceStorage`` on SQLite or PostgreSQL; see ``storage.py`` for the protocol.

    ``url``: a file path (SQLite, created with its folder if missing), ``sqlite:///path``, or a
    ``postgresql+psycopg2://`` URL. ``table`` names the experience table (claims and write keys go to
    ``{table}_claims`` and ``{table}_write_keys``), so several buffers can share one database.
    A consumer name belongs to one live process at a time: ``recover(name)`` hands back *all* its open
    claims. Open the storage after a fork, not before (a connection pool does not survive a fork).
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        table: str = "experiences",
        poll_s: float = 0.05,
        reconnect_s: float = PG_RECONNECT_S,
    ) -> None:
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(
                f"SqlStorage(table={table!r}): use 1-41 lower-case letters, digits and underscores, "
                "starting with a letter or underscore"
            )
        self.url = parse_url(url)
        self.where = self.url.render_as_string(hide_password=True)
        self.table = table
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s  # PostgreSQL: how long a lost connection is retried
        self._rows, self._claims, self._keys, self._uses = tables(table)
        self._engine = create_engine(self.url, self.where)
        self._opened = False
        self._create_schema()
        self._opened = True

    def __repr__(self) -> str:
        return f"SqlStorage({self.where!r}, table={self.table!r})"

    def __enter__(self) -> SqlStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(
        self, experiences: Sequence[Experience], *, key: str | None = None, pending: bool = False
    ) -> list[int]:
        if not experiences:
            return []
        if key is not None and not 1 <= len(key) <= 255:
            raise ValueError(f"SqlStorage.write(key={key!r}): a write key has 1 to 255 characters")
        now = time.time()
        values = [row_values(e, key, now, "pending" if pending else "ready") for e in experiences]
        rows = self._rows

        def insert(conn: sa.Connection) -> list[int]:
            if key is not None:
                conn.execute(sa.insert(self._keys).values(key=key, written_at=now))
            stmt = sa.insert(rows).returning(rows.c.id, sort_by_parameter_order=True)
            return list(conn.execute(stmt, values).scalars())

        try:
            return self._transaction(f"writing {len(values)} experiences", insert)
        except sa_exc.IntegrityError as error:
            if key is None:
                raise
            conflict = error  # the key was written before (a re-run step, or a retried commit that landed)

        def look_up(conn: sa.Connection) -> list[int]:
            stmt = sa.select(rows.c.id).where(rows.c.write_key == key).order_by(rows.c.id)
            return list(conn.execute(stmt).scalars())

        ids = self._transaction(f"looking up write key {key!r}", look_up)
        if not ids:
            raise conflict  # not a repeated key: some other constraint failed
        return ids

    def attach_reward(
        self,
        task_id: str,
        reward: float,
        *,
        run_index: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> list[int]:
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"attach_reward({task_id!r}, reward={reward}): a reward must be a finite number")
        feedback = json_safe(dict(info), "feedback info", task_id) if info else None
        rows = self._rows

        def attach(conn: sa.Connection) -> list[int]:
            found = conn.execute(
                sa.select(rows.c.id, rows.c.status, rows.c.fields)
                .where(rows.c.task_id == task_id)
                .order_by(rows.c.id)
                .with_for_update()
            ).all()
            targets = [(r, json.loads(r.fields)) for r in found]
            if run_index is not None:
                targets = [(r, f) for r, f in targets if f.get("run_index") == run_index]
            if not targets:
                raise UnknownExperience(self._unknown(task_id, run_index, found))
            done = [(r, f) for r, f in targets if r.status != "pending"]
            if done:
                raise RewardConflict(self._conflict(task_id, *done[0]))
            now = time.time()
            updates = []
            for r, fields in targets:
                fields["reward"] = reward
                fields["info"] = {**fields.get("info", {}), "rewarded_at": now}
                if feedback is not None:
                    fields["info"]["feedback"] = feedback
                updates.append({"row": r.id, "new_fields": json.dumps(fields)})
            conn.execute(
                sa.update(rows)
                .where(rows.c.id == sa.bindparam("row"))
                .values(status="ready", fields=sa.bindparam("new_fields")),
                updates,
            )
            return [r.id for r, _ in targets]

        return self._transaction(f"attaching a reward to {task_id!r}", attach)

    def read(
        self,
        n: int,
        *,
        policy: ReadPolicy = FIFO,
        consumer: str = "trainer",
        step: int | None = None,
        timeout: float | None = None,
        waiting: Callable[[], None] | None = None,
    ) -> Claim:
        if n < 1:
            raise ValueError(f"SqlStorage.read(n={n}): n must be >= 1 experiences")
        if not 1 <= len(consumer) <= 255:
            raise ValueError(
                f"SqlStorage.read(consumer={consumer!r}): a consumer name has 1 to 255 characters"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = self.poll_s
        while True:
            claim = self._try_claim(n, policy, consumer, step)
            if claim is not None:
                return claim
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(self._shortage(n, policy, consumer, step, timeout))
            if waiting is not None:
                waiting()
            time.sleep(wait if left is None else min(wait, left))
            wait = min(2 * wait, 1.0)

    def use(self, claim: Claim | str) -> None:
        rows, claims, uses = self._rows, self._claims, self._uses
        token = claim.token if isinstance(claim, Claim) else claim

        def use_claim(conn: sa.Connection) -> Any:
            found = self._claim_to_close(conn, token)
            if found.status != "open":
                return  # used or committed before
            before = conn.execute(
                sa.select(rows.c.id, rows.c.last_use_step).where(rows.c.claim_token == token)
            )
            undo = [{"token": token, "row_id": r.id, "last_use_step_before": r.last_use_step} for r in before]
            if undo:
                conn.execute(sa.insert(uses), undo)
            self._count_use(conn, found)
            conn.execute(sa.update(claims).where(claims.c.token == token).values(status="used"))

        return self._transaction(f"counting the use of claim {token!r}", use_claim)

    def commit(self, claim: Claim | str) -> None:
        token = claim.token if isinstance(claim, Claim) else claim
        claims = self._claims

        def commit_claim(conn: sa.Connection) -> Any:
            found = self._claim_to_close(conn, token)
            if found.status == "committed":
                return
            if found.status == "open":
                self._count_use(conn, found)
            conn.execute(
                sa.update(claims)
                .where(claims.c.token == token)
                .values(status="committed", closed_at=time.time())
            )

        return self._transaction(f"committing claim {token!r}", commit_claim)

    def _claim_to_close(self, conn: sa.Connection, token: str) -> sa.Row:
        """The claim ``token``, locked, for ``use`` or ``commit``; a missing or handed-back one is an error."""
        claims = self._claims
        found = conn.execute(sa.select(claims).where(claims.c.token == token).with_for_update()).one_or_none()
        if found is None:
            raise StorageError(
                f"experience storage {self.where}: there is no claim {token!r} in table "
                f"{claims.name}; commit only tokens that read() on this storage returned"
            )
        if found.status == "released":
            raise StorageError(
                f"experience storage {self.where}: claim {token!r} of consumer {found.consumer!r} "
                f"({found.size} experiences, step {found.step}) was handed back by recover(), so they "
                "may have been served again; committing it now could train on them twice. On resume, "
                "commit the claims of the checkpoint first, then call recover()"
            )
        return found

    def _count_use(self, conn: sa.Connection, found: sa.Row) -> None:
        """One more use of the rows of the claim ``found``: ready for the next read, or consumed at max_uses."""
        rows = self._rows
        count = rows.c.use_count + 1
        status: Any = "ready"
        if found.max_uses is not None:
            status = sa.case((count >= found.max_uses, "consumed"), else_="ready")
        conn.execute(
            sa.update(rows)
            .where(rows.c.claim_token == found.token)
            .values(use_count=count, last_use_step=found.step, status=status, claim_token=None)
        )

    def recover(self, consumer: str) -> int:
        rows, claims, uses = self._rows, self._claims, self._uses

        def release(conn: sa.Connection) -> Any:
            tokens = list(
                conn.execute(
                    sa.select(claims.c.token)
                    .where(claims.c.consumer == consumer, claims.c.status == "open")
                    .with_for_update()
                ).scalars()
            )
            released = 0
            if tokens:
                released = conn.execute(
                    sa.update(rows)
                    .where(rows.c.claim_token.in_(tokens))
                    .values(status="ready", claim_token=None)
                ).rowcount
            # used but in no checkpoint: their uses are undone, the newest first, so that each row's
            # use count and last use step are again those the resumed model was trained with
            used = conn.execute(
                sa.select(claims.c.token, claims.c.step)
                .where(claims.c.consumer == consumer, claims.c.status == "used")
                .order_by(claims.c.step.desc(), claims.c.claimed_at.desc())
                .with_for_update()
            ).all()
            for token, step in used:
                undo = [
                    {"row": r.row_id, "step": step, "before": r.last_use_step_before}
                    for r in conn.execute(sa.select(uses).where(uses.c.token == token))
                ]
                if undo:
                    conn.execute(
                        sa.update(rows)
                        .where(rows.c.id == sa.bindparam("row"))
                        .values(
                            use_count=rows.c.use_count - 1,
                            last_use_step=sa.case(
                                (rows.c.last_use_step == sa.bindparam("step"), sa.bindparam("before")),
                                else_=rows.c.last_use_step,
                            ),
                            status=sa.case((rows.c.status == "consumed", "ready"), else_=rows.c.status),
                        ),
                        undo,
                    )
                released += len(undo)
            closed = tokens + [token for token, _ in used]
            if closed:
                conn.execute(
                    sa.update(claims)
                    .where(claims.c.token.in_(closed))
                    .values(status="released", closed_at=time.time())
                )
            return int(released)

        return self._transaction(f"recovering the claims of {consumer!r}", release)

    def peek(self, status: Status | None = None, *, limit: int = 100) -> list[Experience]:
        """Up to ``limit`` experiences in ``status`` (any when None), the newest first, without claiming or
        changing them: for viewers (Studio's trajectories and annotation), never for training."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"SqlStorage.peek(status={status!r}): use one of {list(STATUSES)} or None")
        rows = self._rows
        stmt = sa.select(rows.c.id, rows.c.record_format, rows.c.fields, rows.c.tensors)
        if status is not None:
            stmt = stmt.where(rows.c.status == status)
        stmt = stmt.order_by(rows.c.id.desc()).limit(max(0, int(limit)))

        def select(conn: sa.Connection) -> list[sa.Row]:
            return list(conn.execute(stmt).all())

        return [self._decode(r) for r in self._transaction(f"listing {status or 'all'} experiences", select)]

    def count(self, status: Status | None = None) -> int:
        stmt = sa.select(sa.func.count()).select_from(self._rows)
        if status is not None:
            if status not in STATUSES:
                raise ValueError(f"SqlStorage.count(status={status!r}): use one of {list(STATUSES)} or None")
            stmt = stmt.where(self._rows.c.status == status)

        def count_rows(conn: sa.Connection) -> Any:
            return int(conn.execute(stmt).scalar_one())

        return self._transaction("counting experiences", count_rows)

    def close(self) -> None:
        self._engine.dispose()

    # -- internals --------------------------------------------------------------------------------------

    def _try_claim(self, n: int, policy: ReadPolicy, consumer: str, step: int | None) -> Claim | None:
        rows, claims = self._rows, self._claims
        token = uuid.uuid4().hex  # made here: a retried claim finds out whether its first try committed
        tries = 0

        def claim(conn: sa.Connection) -> Claim | None:
            nonlocal tries
            tries += 1
            if tries > 1 and (held := self._claimed(conn, token)) is not None:
                return held
            at_step = self._next_step(conn, consumer) if step is None else step
            where, order, max_uses = selection(rows, policy, at_step)
            ids = list(
                conn.execute(
                    sa.select(rows.c.id)
                    .where(*where)
                    .order_by(*order)
                    .limit(n)
                    .with_for_update(skip_locked=True)
                ).scalars()
            )
            if len(ids) < n:
                return None
            conn.execute(
                sa.update(rows).where(rows.c.id.in_(ids)).values(status="claimed", claim_token=token)
            )
            conn.execute(
                sa.insert(claims).values(
                    token=token,
                    consumer=consumer,
                    step=at_step,
                    max_uses=max_uses,
                    size=n,
                    status="open",
                    claimed_at=time.time(),
                )
            )
            return self._claim_of(conn, token, consumer, at_step, ids)

        return self._transaction(f"claiming {n} experiences for {consumer!r}", claim)

    def _claimed(self, conn: sa.Connection, token: str) -> Claim | None:
        """The claim ``token`` when a try whose commit was cut off did commit it (None: it did not)."""
        found = conn.execute(sa.select(self._claims).where(self._claims.c.token == token)).one_or_none()
        if found is None:
            return None
        rows = self._rows
        ids = list(
            conn.execute(
                sa.select(rows.c.id).where(rows.c.claim_token == token).order_by(rows.c.id)
            ).scalars()
        )
        return self._claim_of(conn, token, found.consumer, found.step, ids)

    def _claim_of(self, conn: sa.Connection, token: str, consumer: str, step: int, ids: list[int]) -> Claim:
        rows = self._rows
        payload = conn.execute(
            sa.select(rows.c.id, rows.c.record_format, rows.c.fields, rows.c.tensors).where(
                rows.c.id.in_(ids)
            )
        )
        # decoded inside the transaction: a damaged row fails the read instead of staying claimed
        by_id = {r.id: self._decode(r) for r in payload}
        return Claim(token, consumer, step, tuple(ids), tuple(by_id[i] for i in ids))

    def _unknown(self, task_id: str, run_index: int | None, found: Sequence[sa.Row]) -> str:
        where = f"experience storage {self.where} table {self.table}"
        if not found:
            return (
                f"{where} holds no experience of task {task_id!r}; give the id of a recorded call (the "
                "response's 'id'), written to this storage"
            )
        indices = sorted({json.loads(r.fields).get("run_index") for r in found})
        return (
            f"{where}: task {task_id!r} has no experience with run index (choice) {run_index}; it has "
            f"{indices}. Omit the choice to reward all of them"
        )

    def _conflict(self, task_id: str, row: sa.Row, fields: Mapping[str, Any]) -> str:
        when = fields.get("info", {}).get("rewarded_at")
        how = "it was written with its reward" if when is None else f"its reward was attached at {when:.3f}"
        return (
            f"experience storage {self.where} table {self.table} id {row.id} (task {task_id!r}, run index "
            f"{fields.get('run_index')}) already has the reward {fields.get('reward')} ({how}; status "
            f"{row.status}). A reward is attached once, because a trainer may already have trained on the "
            "first; nothing was changed"
        )

    def _next_step(self, conn: sa.Connection, consumer: str) -> int:
        claims = self._claims
        last = conn.execute(sa.select(sa.func.max(claims.c.step)).where(claims.c.consumer == consumer))
        value = last.scalar_one()
        return 0 if value is None else int(value) + 1

    def _decode(self, row: sa.Row) -> Experience:
        record = {"format": row.record_format, "fields": json.loads(row.fields), "tensors": row.tensors}
        return record_to_experience(record, where=f"{self.where} table {self.table} id {row.id}")

    def _shortage(
        self, n: int, policy: ReadPolicy, consumer: str, step: int | None, timeout: float | None
    ) -> str:
        rows = self._rows

        def count_rows(conn: sa.Connection) -> Any:
            by_status = dict(
                conn.execute(sa.select(rows.c.status, sa.func.count()).group_by(rows.c.status)).all()
            )
            where, _, _ = selection(rows, policy, self._next_step(conn, consumer) if step is None else step)
            eligible = conn.execute(sa.select(sa.func.count()).select_from(rows).where(*where)).scalar_one()
            return by_status, eligible

        by_status, eligible = self._transaction("counting experiences", count_rows)
        counts = ", ".join(f"{by_status.get(s, 0)} {s}" for s in STATUSES)
        return (
            f"experience storage {self.where}: read(n={n}, policy={policy}, consumer={consumer!r}) timed "
            f"out after {timeout} s with {eligible} eligible experiences ({counts}). The writer (explorer) "
            "has produced fewer than this reader asks for: check that it is running and writing to this "
            "storage, or raise the timeout; pending experiences wait for their reward (POST /feedback of "
            "the serve process); under a replay policy, max_uses or cooldown_steps may also hold "
            "experiences back"
        )

    def _create_schema(self) -> None:
        with self._begin("creating the experience tables") as conn:
            if self.url.get_backend_name() == "postgresql":
                # two processes opening a fresh database must not both CREATE TABLE
                lock = zlib.crc32(self.table.encode())
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock})
            self._rows.metadata.create_all(conn)
            for index in self._rows.indexes:  # a table made by an older trivium lacks the newer ones
                index.create(conn, checkfirst=True)

    def _transaction(self, doing: str, body: Callable[[sa.Connection], T]) -> T:
        """``body(conn)`` in one transaction. On PostgreSQL a lost connection (the server restarting, the
        network) is retried with the same body for up to ``reconnect_s``, waiting 0.5 s, then longer, up
        to 5 s, between tries; every body is safe to retry (see the module docstring)."""
        deadline, wait = None, 0.5
        while True:
            try:
                with self._begin(doing) as conn:
                    return body(conn)
            except StorageError as error:
                if not self._reconnectable(error.__cause__):
                    raise
                now = time.monotonic()
                deadline = now + self.reconnect_s if deadline is None else deadline
                if now >= deadline:
                    raise StorageError(
                        f"{error} (the connection was lost; retried for {self.reconnect_s:g} s)"
                    ) from error.__cause__
                log.warning(
                    "experience storage %s: %s lost its connection (%s); retrying for up to %.0f s more",
                    self.where,
                    doing,
                    str(getattr(error.__cause__, "orig", error.__cause__)).strip().splitlines()[0][:200],
                    deadline - now,
                )
                time.sleep(min(wait, max(0.0, deadline - now)))
                wait = min(2 * wait, 5.0)

    def _reconnectable(self, cause: BaseException | None) -> bool:
        """A PostgreSQL connection error after the storage opened (a wrong URL at start fails at once)."""
        if not self._opened or self.url.get_backend_name() != "postgresql":
            return False
        if isinstance(cause, sa_exc.DBAPIError) and cause.connection_invalidated:
            return True
        return isinstance(cause, sa_exc.OperationalError)

    @contextmanager
    def _begin(self, doing: str) -> Iterator[sa.Connection]:
        try:
            with self._engine.begin() as conn:
                yield conn
        except sa_exc.DBAPIError as error:
            if not isinstance(error, sa_exc.OperationalError) and not error.connection_invalidated:
                raise
            raise StorageError(explain(self.url, self.where, doing, error)) from error
