"""Open a SQLAlchemy engine on a SQLite file path or a database URL, set up for several processes.

SQLite: every transaction starts with ``BEGIN IMMEDIATE`` (the driver's own BEGIN is switched off), so
the first statement of a transaction already holds the write lock and two processes never interleave a
read-then-update; WAL lets readers work while one process writes, and ``synchronous=FULL`` makes a
returned commit survive power loss, not only a killed process. PostgreSQL: a connect timeout, so an
unreachable server fails in seconds, and pre-ping, so a restarted server does not break the pool.

Every error names the URL with its password masked and says what to do.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from trivium.buffer.storage import StorageError
from trivium.files import NETWORK_FILE_SYSTEMS, mount_of

__all__ = ["create_engine", "explain", "parse_url"]

SQLITE_BUSY_TIMEOUT_S = 60.0  # how long a transaction waits for another process's write lock
PG_CONNECT_TIMEOUT_S = 10
PG_RECONNECT_S = 120.0  # how long an operation retries a lost PostgreSQL connection (storage_sql.py)


def parse_url(url: str | os.PathLike[str]) -> sa.URL:
    """A file path becomes a SQLite URL (its folder is created); a URL must name SQLite or PostgreSQL."""
    if not str(url).strip():
        raise StorageError("experience storage: empty path; give a SQLite file path or a database URL")
    if isinstance(url, os.PathLike) or "://" not in url:
        path = Path(url).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StorageError(
                f"experience storage {path}: cannot create its folder ({error}); give a path in a "
                "writable folder (by default the run folder)"
            ) from error
        return _local_sqlite(sa.URL.create("sqlite", database=str(path.resolve())))
    try:
        parsed = sa.make_url(url)
    except (sa_exc.ArgumentError, ValueError) as error:
        raise StorageError(
            f"experience storage: {_mask(url)!r} is not a database URL ({error}); give a SQLite file "
            "path, or a URL like postgresql+psycopg2://user:password@host:5432/database"
        ) from error
    backend = parsed.get_backend_name()
    masked = parsed.render_as_string(hide_password=True)
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise StorageError(
            f"experience storage {masked}: an in-memory SQLite database would vanish with the process "
            "and differ between connections; give a file path (e.g. the run folder's buffer.db)"
        )
    if backend not in ("sqlite", "postgresql"):
        hint = " (write postgresql://, not postgres://)" if backend == "postgres" else ""
        raise StorageError(
            f"experience storage {masked}: database {backend!r} is not supported{hint}; use a SQLite "
            "file path or a postgresql+psycopg2:// URL"
        )
    return _local_sqlite(parsed) if backend == "sqlite" else parsed


def _local_sqlite(url: sa.URL) -> sa.URL:
    """``url``, unless its SQLite file is on a network file system: the write-ahead log (journal_mode WAL)
    needs every process that opens the file on one machine, and over NFS, SMB, Lustre, ... it corrupts the
    database or fails to lock. The processes of a run on several nodes share a buffer by PostgreSQL; a Ray
    run opens it on the driver's node only, so a SQLite file on a local disk there is fine."""
    mount = mount_of(url.database)
    if mount is None or mount[0] not in NETWORK_FILE_SYSTEMS:
        return url
    kind, point = mount
    raise StorageError(
        f"experience storage {url.database}: the SQLite file is on a network file system ({kind} mounted "
        f"at {point}). SQLite's write-ahead log needs every process that opens the file on one machine, and "
        "on a network file system it fails to lock or corrupts the buffer. Set buffer.storage.url to a file "
        "on a local disk of this machine (a Ray run opens the buffer on the driver's node only), or to a "
        "PostgreSQL URL (postgresql+psycopg2://user:password@host:5432/database) when processes on several "
        "machines share the buffer (docs/cluster.md)"
    )


def create_engine(url: sa.URL, where: str) -> sa.Engine:
    if url.get_backend_name() == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        sa.event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    connect_args = {}
    if url.get_driver_name() == "psycopg2" and "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    try:
        return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    except (ImportError, sa_exc.NoSuchModuleError) as error:
        raise StorageError(
            f"experience storage {where}: the database driver is missing ({error}); install it with "
            "`pip install psycopg2-binary` for postgresql+psycopg2:// URLs"
        ) from error


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver must not BEGIN on its own: _sqlite_on_begin does
    cursor = dbapi_conn.cursor()
    _write_ahead_log(cursor)
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


def _write_ahead_log(cursor: Any) -> None:
    """``journal_mode=WAL``, tried again while another process holds a lock on the file, for up to
    ``SQLITE_BUSY_TIMEOUT_S``. SQLite does not wait (its busy timeout) for the lock that switching the
    journal mode takes: two processes opening a new buffer file at the same instant (an explore and a train
    process started together, as the README's decoupled example does) made one of them fail at once with
    "database is locked" (4 processes at once: 6 trials in 20). The mode is kept in the file, so only the
    first connections to a new file ever switch it."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    pause = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            busy = "locked" in str(error) or "busy" in str(error)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.5)


def _sqlite_on_begin(conn: sa.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def explain(url: sa.URL, where: str, doing: str, error: sa_exc.OperationalError) -> str:
    message = str(error.orig).strip()
    if url.get_backend_name() == "sqlite":
        if "locked" in message:
            hint = (
                f"another process held the write lock for over {SQLITE_BUSY_TIMEOUT_S:.0f} s; find it "
                "(e.g. `fuser` on the file) or move the buffer to PostgreSQL for many writers"
            )
        else:
            hint = "check that the folder exists and is writable and that the file is a SQLite database"
    else:
        hint = (
            "check that the PostgreSQL server is running and reachable at that host and port, that the "
            "database exists (createdb NAME) and that the user and password are right"
        )
    return f"experience storage {where}: {doing} failed: {message}. What to do: {hint}"


def _mask(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)
