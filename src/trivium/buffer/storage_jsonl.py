"""Experience storage in one append-only JSONL file, for data you want to read with other tools.

Each line is one experience: ``{"id", "key", "last", "format", "fields", "tensors"}`` with the record of
``storage.py`` (``fields`` as a JSON object, ``tensors`` as base64 safetensors). The id of an experience
is the byte offset of its line: unique and increasing, not dense.

Design decisions:
- A write is one ``write()`` of all its lines, then ``fsync``, under an exclusive ``flock`` on the file,
  so several writer processes may append. The last line of each write says ``"last": true``; a reader
  only takes lines up to the last such line, so a write torn by a crash (some lines on disk, maybe half
  a line) is never read. The next writer cuts the torn tail off before it appends.
- A reader's position is a byte offset. ``commit`` moves the consumer's cursor file
  (``{file}.{consumer}.cursor``) to the end of the claim, written atomically (temp file, fsync, rename);
  ``recover`` moves the in-memory position back to it. A restarted reader starts from the cursor.
- Write keys (idempotent writes) are found by scanning the file: each writer scans it once on its first
  write, then only what other writers appended since.

Limits: one reader process per consumer name (the cursor file is locked; a second reader fails), and
every consumer name reads every experience: names give independent cursors, not a shared work queue as
in ``SqlStorage``. Claims are committed in read order. Only the FIFO policy: a replay policy needs
per-experience use counts, which an append-only file cannot update; use ``SqlStorage`` for replay.
No delayed rewards either (``write(pending=True)``, ``attach_reward``: serve mode): they rewrite a
stored experience; they raise ``NotImplementedError`` naming ``SqlStorage``. ``count`` reads the whole
file.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trivium.buffer.replay import FIFO, Fifo, ReadPolicy
from trivium.buffer.storage import (
    STATUSES,
    Claim,
    Status,
    StorageError,
    experience_to_record,
    record_to_experience,
)
from trivium.files import sync_folder, write_atomically
from trivium.types import Experience

__all__ = ["JsonlStorage"]


class JsonlStorage:
    """``ExperienceStorage`` on one JSONL file; see the module docstring for its limits."""

    def __init__(self, path: str | os.PathLike[str], *, poll_s: float = 0.05) -> None:
        self.path = Path(path).expanduser().resolve()
        self.poll_s = poll_s
        self._scanned_to = 0  # the writer knows the file up to here (always the end of a complete write)
        self._keys: dict[str, list[int]] = {}
        self._readers: dict[str, _Reader] = {}

    def __repr__(self) -> str:
        return f"JsonlStorage({str(self.path)!r})"

    def __enter__(self) -> JsonlStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(
        self, experiences: Sequence[Experience], *, key: str | None = None, pending: bool = False
    ) -> list[int]:
        if pending:
            raise NotImplementedError(_NO_REWARDS.format(path=self.path, what="write(pending=True)"))
        if not experiences:
            return []
        records = [experience_to_record(e) for e in experiences]  # fail on bad data before locking
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if created:
                sync_folder(self.path.parent)
            end = self._catch_up(fd)
            if key is not None and key in self._keys:
                return list(self._keys[key])
            ids, lines = [], []
            for i, record in enumerate(records):
                ids.append(end + sum(len(line) for line in lines))
                lines.append(_encode(ids[-1], key, i == len(records) - 1, record))
            _write_all(fd, b"".join(lines))
            os.fsync(fd)
            self._scanned_to = end + sum(len(line) for line in lines)
            if key is not None:
                self._keys[key] = ids
            return ids
        finally:
            os.close(fd)  # releases the lock

    def attach_reward(
        self,
        task_id: str,
        reward: float,
        *,
        run_index: int | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> list[int]:
        raise NotImplementedError(_NO_REWARDS.format(path=self.path, what="attach_reward"))

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
            raise ValueError(f"JsonlStorage.read(n={n}): n must be >= 1 experiences")
        if not isinstance(policy, Fifo):
            raise StorageError(
                f"experience storage {self.path}: JSONL storage reads with policy FIFO only, got {policy}; "
                "use SqlStorage for a replay policy"
            )
        reader = self._reader(consumer)
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = self.poll_s
        while True:
            taken = self._scan(reader.position, n)
            if len(taken) == n:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"experience storage {self.path}: read(n={n}, consumer={consumer!r}) timed out after "
                    f"{timeout} s with {len(taken)} complete experiences after byte {reader.position}. The "
                    "writer (explorer) has produced fewer than this reader asks for: check that it is "
                    "running and writing to this file, or raise the timeout"
                )
            if waiting is not None:
                waiting()
            time.sleep(wait if left is None else min(wait, left))
            wait = min(2 * wait, 1.0)
        start, end = reader.position, taken[-1][1]
        reader.position = end
        step = reader.next_step if step is None else step
        reader.next_step = step + 1
        experiences = tuple(
            record_to_experience(record, where=f"{self.path} byte {offset}") for offset, _, record in taken
        )
        return Claim(f"{consumer}:{start}:{end}", consumer, step, tuple(o for o, _, _ in taken), experiences)

    def use(self, claim: Claim | str) -> None:
        """Nothing to count: FIFO never serves a claimed line again, and the cursor moves at ``commit``."""

    def commit(self, claim: Claim | str) -> None:
        token = claim.token if isinstance(claim, Claim) else claim
        try:
            consumer, start_text, end_text = token.rsplit(":", 2)
            start, end = int(start_text), int(end_text)
        except ValueError:
            raise StorageError(
                f"experience storage {self.path}: {token!r} is not a JSONL claim token (CONSUMER:START:END, "
                "byte offsets); commit only tokens that read() on this storage returned"
            ) from None
        reader = self._reader(consumer)
        if end <= reader.cursor:
            return  # committed before
        if start != reader.cursor:
            raise StorageError(
                f"experience storage {self.path}: claim {token} of {consumer!r} starts at byte {start} but "
                f"the committed cursor is at byte {reader.cursor}; commit claims in the order read() "
                "returned them"
            )
        write_atomically(reader.cursor_path, json.dumps({"offset": end}).encode(), durable=True)
        reader.cursor = end
        reader.position = max(reader.position, end)

    def recover(self, consumer: str) -> int:
        reader = self._reader(consumer)
        released = len(self._scan(reader.cursor, None, stop=reader.position))
        reader.position = reader.cursor
        return released

    def count(self, status: Status | None = None) -> int:
        """``claimed`` and ``consumed`` are this process's view of its open consumers."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"JsonlStorage.count(status={status!r}): use one of {list(STATUSES)} or None")
        offsets = [o for o, _, _ in self._scan(0, None, decode=False)]
        if status is None:
            return len(offsets)
        if status == "pending":
            return 0  # this storage has no delayed rewards
        readers = list(self._readers.values())
        cursor = min((r.cursor for r in readers), default=0)
        position = max((r.position for r in readers), default=0)
        ranges = {"consumed": (0, cursor), "claimed": (cursor, position), "ready": (position, 1 << 62)}
        low, high = ranges[status]
        return sum(low <= o < high for o in offsets)

    def close(self) -> None:
        for reader in self._readers.values():
            os.close(reader.lock_fd)
        self._readers.clear()

    # -- internals --------------------------------------------------------------------------------------

    def _reader(self, consumer: str) -> _Reader:
        if consumer not in self._readers:
            self._readers[consumer] = _Reader.open(self.path, consumer)
        return self._readers[consumer]

    def _scan(
        self, start: int, n: int | None, stop: int | None = None, decode: bool = True
    ) -> list[tuple[int, int, Any]]:
        """Up to ``n`` experiences of complete writes from byte ``start`` (to ``stop``, a position a reader
        reached before): ``(offset, end, record)``."""
        if not self.path.exists():
            return []
        taken: list[tuple[int, int, Any]] = []
        pending: list[tuple[int, int, Any]] = []
        with open(self.path, "rb") as f:
            f.seek(start)
            offset = start
            while (n is None or len(taken) < n) and (stop is None or offset < stop):
                line = f.readline()
                if not line.endswith(b"\n"):
                    break  # end of file, or a line still being written or torn
                entry = _decode(line, self.path, offset, decode)
                pending.append((offset, offset + len(line), entry))
                offset += len(line)
                if entry["last"] or offset == stop:  # a reader stopped at ``stop`` before: complete
                    taken += pending
                    pending = []
        return taken if n is None else taken[:n]

    def _catch_up(self, fd: int) -> int:
        """Under the write lock: learn the keys written since the last scan, cut a torn tail; returns
        the end of the last complete write, where the next one goes."""
        size = os.fstat(fd).st_size
        if size < self._scanned_to:
            raise StorageError(
                f"experience storage {self.path}: the file shrank from {self._scanned_to} to {size} bytes "
                "while this process used it; something else truncated or replaced it"
            )
        end = self._scanned_to
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(end)
            offset = end
            keys: dict[str, list[int]] = {}
            for line in iter(f.readline, b""):
                if not line.endswith(b"\n"):
                    break
                entry = _decode(line, self.path, offset, decode=False)
                if entry.get("key") is not None:
                    keys.setdefault(entry["key"], []).append(offset)
                offset += len(line)
                if entry["last"]:
                    end = offset
                    for k, ids in keys.items():
                        self._keys.setdefault(k, []).extend(ids)
                    keys = {}
        if size > end:  # a write torn by a crash: no reader ever took it (no "last" line after it)
            os.ftruncate(fd, end)
            os.fsync(fd)
        self._scanned_to = end
        return end


_NO_REWARDS = (
    "experience storage {path}: JSONL storage does not support {what} (delayed rewards, serve mode): an "
    "append-only file cannot change a stored experience; use SqlStorage (buffer.storage.url: a SQLite file "
    "or a PostgreSQL URL)"
)


class _Reader:
    """A consumer's committed cursor (on disk) and read position (in memory), and the lock on both."""

    def __init__(self, cursor_path: Path, lock_fd: int, cursor: int) -> None:
        self.cursor_path = cursor_path
        self.lock_fd = lock_fd
        self.cursor = cursor
        self.position = cursor
        self.next_step = 0

    @classmethod
    def open(cls, path: Path, consumer: str) -> _Reader:
        if not consumer or "/" in consumer or consumer.startswith("."):
            raise ValueError(
                f"JsonlStorage consumer {consumer!r}: it names a file next to the data, so use a plain "
                "name (no '/', not starting with '.')"
            )
        cursor_path = path.with_name(f"{path.name}.{consumer}.cursor")
        lock_path = path.with_name(f"{path.name}.{consumer}.lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise StorageError(
                f"experience storage {path}: another reader (process or JsonlStorage) reads it as consumer {consumer!r} "
                f"(it holds {lock_path}); a JSONL storage has one reader per consumer name: stop that "
                "process or use SqlStorage for several readers"
            ) from None
        cursor = 0
        if cursor_path.exists():
            try:
                cursor = int(json.loads(cursor_path.read_bytes())["offset"])
            except (ValueError, KeyError, TypeError) as error:
                os.close(lock_fd)
                raise StorageError(
                    f"experience storage {path}: cursor file {cursor_path} is damaged ({error}); it holds "
                    '{"offset": BYTES}, the end of the last trained line: restore it from the checkpoint'
                ) from error
        return cls(cursor_path, lock_fd, cursor)


def _encode(offset: int, key: str | None, last: bool, record: dict[str, Any]) -> bytes:
    line = {
        "id": offset,
        "key": key,
        "last": last,
        "format": record["format"],
        "fields": record["fields"],
        "tensors": base64.b64encode(record["tensors"]).decode("ascii"),
    }
    return (json.dumps(line) + "\n").encode("utf-8")


def _decode(line: bytes, path: Path, offset: int, decode: bool) -> dict[str, Any]:
    try:
        entry = json.loads(line)
        if decode:
            entry["tensors"] = base64.b64decode(entry["tensors"], validate=True)
        return entry
    except (ValueError, KeyError, TypeError) as error:
        raise StorageError(
            f"experience storage {path}: the line at byte {offset} is damaged ({error}); it is a complete "
            "line, so the file was changed by something other than JsonlStorage. Back the file up and "
            f"truncate it at byte {offset} (`truncate -s {offset} FILE`) to keep what comes before"
        ) from error


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
