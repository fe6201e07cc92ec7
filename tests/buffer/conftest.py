import importlib.util
import uuid
from pathlib import Path

import pytest

from trivium.buffer.storage_sql import SqlStorage

# pg_server.py is a helper module next to the tests (not a test file, not a package)
_spec = importlib.util.spec_from_file_location("trivium_pg_server", Path(__file__).with_name("pg_server.py"))
pg_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pg_server)


@pytest.fixture(autouse=True)
def _hf_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Keep the Arrow cache that load_dataset writes out of ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))


@pytest.fixture(scope="session")
def pg_url():
    """One real PostgreSQL server on 127.0.0.1 for every storage test of the session."""
    if pg_server.find_bin_dir() is None:
        pytest.skip(
            "no PostgreSQL binaries (initdb, pg_ctl, postgres) on PATH or in /usr/lib/postgresql/*/bin; "
            "install them with `apt-get install -y postgresql` to run the PostgreSQL storage tests"
        )
    with pg_server.postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def where(request, tmp_path):
    """(url, table) of an empty storage: a fresh SQLite file, or a fresh table on the shared server."""
    if request.param == "sqlite":
        return str(tmp_path / "run" / "buffer.db"), "experiences"
    return request.getfixturevalue("pg_url"), f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def open_storage(where):
    """Open the storage; each call is a new connection pool, as a restarted process would have."""
    opened = []

    def make():
        opened.append(SqlStorage(where[0], table=where[1]))
        return opened[-1]

    yield make
    for storage in opened:
        storage.close()
