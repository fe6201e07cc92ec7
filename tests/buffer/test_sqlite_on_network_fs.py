"""A SQLite buffer on a network file system is refused (its write-ahead log needs one machine); the mount
table is read as Linux writes it."""

import pytest

import trivium.files
from trivium.buffer.sql_engine import parse_url
from trivium.buffer.storage import StorageError
from trivium.files import mount_of


@pytest.fixture
def mounts(tmp_path, monkeypatch):
    """A mount table (the format of /proc/self/mounts) in which ``tmp_path/shared`` is an NFS mount."""
    table = tmp_path / "mounts"
    shared, spaced = tmp_path / "shared", tmp_path / "my disk"
    spaced_field = str(spaced).replace(" ", "\\040")
    table.write_text(
        "proc /proc proc rw,relatime 0 0\n"
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        f"fileserver:/export {shared} nfs4 rw,vers=4.2,addr=10.0.0.5 0 0\n"
        f"tmpfs {shared}/scratch tmpfs rw 0 0\n"
        f"/dev/sdb1 {spaced_field} xfs rw 0 0\n"
    )
    monkeypatch.setattr(trivium.files, "MOUNTS", table)
    return shared, spaced


def test_the_deepest_mount_holding_a_path_is_found(mounts):
    shared, spaced = mounts
    assert mount_of(shared / "run" / "buffer.sqlite") == ("nfs4", str(shared))
    assert mount_of(shared / "scratch" / "b.sqlite") == ("tmpfs", str(shared / "scratch"))
    assert mount_of(spaced / "b.sqlite") == ("xfs", str(spaced))  # \040 in the table is a space
    assert mount_of("/etc/hostname") == ("ext4", "/")


def test_a_sqlite_buffer_on_nfs_is_refused_with_the_way_out(mounts):
    shared, _ = mounts
    for url in (shared / "run" / "buffer.sqlite", f"sqlite:///{shared}/run/buffer.sqlite"):
        with pytest.raises(StorageError) as caught:
            parse_url(url)
        message = str(caught.value)
        assert f"network file system (nfs4 mounted at {shared})" in message
        assert "a local disk" in message and "postgresql+psycopg2://" in message
    assert parse_url(shared / "scratch" / "b.sqlite").database.endswith("b.sqlite")  # a local mount under it


def test_this_machine_s_own_mount_table_is_read():
    kind, point = mount_of(__file__)
    assert kind and point.startswith("/")
