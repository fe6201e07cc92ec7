"""A throwaway PostgreSQL server for tests and CI: initdb into a temp folder, start it on a free port,
create a database, and stop and delete it all on exit.

    python tests/buffer/pg_server.py      # start one, print its URL, stop on Ctrl-C

initdb and postgres refuse to run as root. As root (CI) the server runs as the ``postgres`` user that the
Debian package creates, or else as a system user ``trivium-pg`` made with ``useradd``; its folder lives
under /tmp, not under pytest's root-only tmp_path. The server is tuned for speed (fsync off, trust
authentication on 127.0.0.1): never for data you want to keep.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

SUPERUSER = "trivium"
BIN_DIRS = "/usr/lib/postgresql/*/bin"


def find_bin_dir() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres: from PATH, else the newest Debian install."""
    on_path = shutil.which("pg_ctl")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    versions = sorted(Path("/").glob(BIN_DIRS.lstrip("/")), key=lambda p: _version(p.parent.name))
    candidates += reversed(versions)
    for folder in candidates:
        if all((folder / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


@contextlib.contextmanager
def postgres_server(dbname: str = "trivium_test") -> Iterator[str]:
    """Yield a ``postgresql+psycopg2://`` URL of a fresh database on a server that lives for the block."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError(
            f"no PostgreSQL binaries (initdb, pg_ctl, postgres) on PATH or in {BIN_DIRS}; "
            "install them with `apt-get install -y postgresql`"
        )
    user = _server_user()
    root = Path(tempfile.mkdtemp(prefix="trivium-pg-"))
    data, log = root / "data", root / "server.log"
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    started = False
    try:
        _run(user, root, bin_dir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "-N")
        port = _free_port()
        options = (
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c synchronous_commit=off"
        )
        _run(user, root, bin_dir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o", options, "start")
        started = True
        _create_database(port, dbname)
        yield f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{port}/{dbname}"
    except subprocess.CalledProcessError as error:
        server_log = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(
            f"PostgreSQL test server in {root} failed: {error}\n{error.stdout}\n{server_log}"
        ) from error
    finally:
        if started:
            _run(user, root, bin_dir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)


def _server_user() -> pwd.struct_passwd | None:
    """None when not root (run as ourselves); else an unprivileged user, created if need be."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "trivium-pg"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "trivium-pg"],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam("trivium-pg")


def _run(user: pwd.struct_passwd | None, cwd: Path, *cmd: object, check: bool = True) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LC_ALL": "C.UTF-8"}
    as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        check=check,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **as_user,
    )


def _create_database(port: int, dbname: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=SUPERUSER, dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{dbname}"')
    finally:
        conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split(".") if p.isdigit())


if __name__ == "__main__":
    with postgres_server() as url:
        print(url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
