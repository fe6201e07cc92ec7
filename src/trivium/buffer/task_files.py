"""Read a task set's rows from local JSON Lines / JSON / Parquet files, remembering where each row came from.

Design decisions:
- JSON is parsed by Python's ``json`` module, never by a native reader: task files come from anywhere, and
  pyarrow's JSON reader (behind HF ``datasets``) crashed the process (exit 139, no message) on a JSON Lines
  file whose first line is ``null`` and on values nested 10,000 deep. Every row is checked before it is
  parsed: UTF-8 (a UTF-16/32 file is named as such), nesting at most ``MAX_ROW_DEPTH`` levels (counted on
  the text, so a deep value is refused without recursing into it), a JSON object.
- A JSON Lines row that fails those checks is *unreadable*: with ``on_bad_row="error"`` the first one is a
  ``TaskDataError`` naming file, row and line; with ``"skip"`` it keeps its row index (``Task.index`` points
  at the same line either way) and is returned in ``LoadedRows.unreadable`` for the reader to count.
  A ``.json`` file is one value: a file that does not parse is an error in both modes; its elements that
  are not objects (or are nested too deep) are unreadable rows like JSON Lines ones.
- Parquet is read by ``pyarrow.parquet`` (typed columns; the depth of its values is bounded by the schema
  and checked like JSON rows). Rows end up as plain dicts: what ``Task.raw`` holds.
- A folder means every ``.jsonl`` / ``.json`` / ``.parquet`` file directly inside it, in name order, one
  task set. Subfolders are not read, so a stray ``old/`` copy is never trained on by accident.
- ``max_rows`` stops reading a JSON Lines file after that many rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trivium.jsontext import text_depth, value_depth

__all__ = [
    "MAX_ROW_DEPTH",
    "MEMORY",
    "LoadedRows",
    "RowLocation",
    "TaskDataError",
    "TaskFileNotFound",
    "load_rows",
]

MEMORY = "<memory>"  # the file name of rows given as a Python list
MAX_ROW_DEPTH = 100  # nesting levels of one row (the row object is level 1); chat rows with tools use ~8
_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class TaskDataError(ValueError):
    """A task set's data cannot be used as configured; the message names the file, row, field and fix."""


class TaskFileNotFound(TaskDataError, FileNotFoundError):
    """The task set's path does not exist (a ``TaskDataError``, and a ``FileNotFoundError`` as before)."""


class SourcedRows(list):
    """Rows read from somewhere other than trivium's own file reader (a CSV file, a dataset folder, the
    hub): a list of dicts that also says where they came from, so that a row's error names it
    (``origin``, and each row's 1-based line in a CSV file)."""

    def __init__(self, rows, origin: str, lines: list[int] | None = None):
        super().__init__(rows)
        self.origin = origin
        self.lines = lines


@dataclass(frozen=True)
class RowLocation:
    file: str
    row: int  # 0-based row index within the file
    line: int | None  # 1-based line number (JSON Lines and CSV files)

    def __str__(self) -> str:
        return f"{self.file} row {self.row}" + (f" (line {self.line})" if self.line is not None else "")


@dataclass
class _Source:
    name: str  # path as given by the user, or MEMORY
    path: Path | None
    start: int  # index of its first row among all rows of the task set
    count: int
    lines: list[int] | None = None  # 1-based line of each row (JSON Lines and CSV files)


@dataclass
class LoadedRows:
    rows: list[dict[str, Any]]  # an unreadable row is an empty dict here
    sources: list[_Source]
    unreadable: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, why)

    def locate(self, index: int) -> RowLocation:
        """Where task-set row ``index`` (0-based, across all files) came from."""
        source = next(s for s in self.sources if s.start <= index < s.start + s.count)
        row = index - source.start
        line = source.lines[row] if source.lines is not None and row < len(source.lines) else None
        return RowLocation(source.name, row, line)


def load_rows(
    source: str | os.PathLike[str] | Sequence[Mapping[str, Any]],
    *,
    split: str = "train",
    taskset: str,
    on_bad_row: str = "error",
    max_rows: int | None = None,
) -> LoadedRows:
    """All rows of ``source`` (a file, a folder of files, or a list of dicts) in file order, at most
    ``max_rows``. ``split`` is accepted for old callers and not used (one file is one split)."""
    del split
    if not isinstance(source, (str, os.PathLike)):
        origin, lines = getattr(source, "origin", MEMORY), getattr(source, "lines", None)
        return _memory_rows(list(source)[:max_rows], taskset, on_bad_row, origin, lines)
    loaded = LoadedRows([], [])
    for path in _resolve_files(source, taskset):
        reader = _Reader(path, taskset, on_bad_row, loaded, max_rows)
        reader.read()
        if max_rows is not None and len(loaded.rows) >= max_rows:
            break
    return loaded


def _memory_rows(
    rows: list[Any], taskset: str, on_bad_row: str, origin: str = MEMORY, lines: list[int] | None = None
) -> LoadedRows:
    loaded = LoadedRows([], [_Source(origin, None, 0, len(rows), lines)])
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            loaded.rows.append(dict(row))
            continue
        why = f"is a {type(row).__name__}, not a dict; pass a list of dicts (one per task)"
        if on_bad_row != "skip":
            raise TaskDataError(f"task set {taskset!r}: {loaded.locate(i)} {why}")
        loaded.rows.append({})
        loaded.unreadable[i] = ("not an object", why)
    return loaded


def _resolve_files(source: str | os.PathLike[str], taskset: str) -> list[Path]:
    supported = ", ".join(_LOADERS)
    path = Path(source)
    try:
        if "\x00" in str(path):
            raise ValueError("a path cannot contain a NUL character")
        exists, is_dir = path.exists(), path.is_dir()
    except (OSError, ValueError) as error:  # a NUL byte, a name too long for the file system
        why = error.strerror if isinstance(error, OSError) else str(error)
        raise TaskDataError(f"task set {taskset!r}: cannot use the path {str(path)[:200]!r}: {why}") from None
    if not exists:
        raise TaskFileNotFound(
            f"task set {taskset!r}: path {str(path)!r} does not exist (resolved to {os.path.abspath(path)}); "
            f"set path to a {supported} file or a folder of them"
        )
    if is_dir:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _LOADERS)
        if not files:
            found = sorted(p.name for p in path.iterdir())[:10]
            raise TaskDataError(
                f"task set {taskset!r}: folder {str(path)!r} has no {supported} files directly inside "
                f"(found {found}); point path at a data file or at the folder that holds them"
            )
        return files
    if not path.is_file():  # a FIFO (reading it waits for a writer, forever), a socket, a device
        raise TaskDataError(
            f"task set {taskset!r}: {str(path)!r} is not a regular file (a pipe, socket or device); it is "
            f"not read, since reading one can wait forever: point path at a {supported} file"
        )
    if path.suffix not in _LOADERS:
        raise TaskDataError(
            f"task set {taskset!r}: {str(path)!r} has extension {path.suffix!r}; supported: {supported}. "
            "Convert the file or rename it if it already is one of these formats"
        )
    return [path]


class _Reader:
    """Appends the rows of one file to ``loaded`` (see the module docstring for the rules)."""

    def __init__(self, path: Path, taskset: str, on_bad_row: str, loaded: LoadedRows, max_rows: int | None):
        self.path, self.taskset, self.skip, self.loaded = path, taskset, on_bad_row == "skip", loaded
        self.room = None if max_rows is None else max_rows - len(loaded.rows)
        self.where = f"task set {taskset!r}: {str(path)!r}"
        self.source = _Source(str(path), path, len(loaded.rows), 0)

    def read(self) -> None:
        if self.path.suffix == ".parquet":
            self._add_all(self._parquet())
        else:
            data = self._bytes()
            if self.path.suffix == ".jsonl":
                self.source.lines = []
                self._jsonl(data)
            else:
                self._add_all(self._json_list(data))
        self.loaded.sources.append(self.source)

    def _bytes(self) -> bytes:
        data = self.path.read_bytes()
        head = data[:4]
        if head.startswith((b"\xff\xfe", b"\xfe\xff")) or (b"\x00" in head and data):
            raise TaskDataError(
                f"{self.where} is UTF-16 or UTF-32 (a byte-order mark or NUL bytes at the start); JSON task "
                "files must be UTF-8: save it as UTF-8"
            )
        return data[3:] if data.startswith(b"\xef\xbb\xbf") else data

    def _jsonl(self, data: bytes) -> None:
        for line_no, raw in enumerate(data.split(b"\n"), start=1):
            if self.room is not None and self.source.count >= self.room:
                return
            if not raw.strip():
                continue
            value, problem = _parse_line(raw)
            self.source.lines.append(line_no)  # type: ignore[union-attr]
            if problem is not None:
                kind, why = problem
                if kind in ("not JSON", "not an object"):
                    why += "; JSON Lines needs one JSON object per line"
                self._unreadable(kind, why, f" (line {line_no})")
                continue
            self._add(value)

    def _json_list(self, data: bytes) -> list[Any]:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            raise TaskDataError(
                f"{self.where} is not UTF-8: byte {data[error.start]:#04x} at offset {error.start} (line "
                f"{line}); save it as UTF-8"
            ) from None
        depth = text_depth(text, MAX_ROW_DEPTH + 1)
        if depth > MAX_ROW_DEPTH + 1:
            raise TaskDataError(
                f"{self.where} nests values {depth} levels deep; rows may nest at most {MAX_ROW_DEPTH} levels"
            )
        try:
            value = json.loads(text, parse_constant=_not_json_constant)
        except ValueError as error:
            at = (
                f" at line {error.lineno}, column {error.colno}"
                if isinstance(error, json.JSONDecodeError)
                else ""
            )
            msg = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
            raise TaskDataError(f"{self.where} is not valid JSON ({msg}{at})") from None
        if not isinstance(value, list):
            raise TaskDataError(
                f'{self.where} must hold a JSON list of objects (one per task), e.g. [{{"question": ...}}]; '
                f"it holds a JSON {type(value).__name__}"
            )
        return value

    def _parquet(self) -> list[Any]:
        import pyarrow.parquet as pq

        try:
            return pq.read_table(self.path).to_pylist()
        except Exception as error:  # pyarrow raises many types for a damaged file
            raise TaskDataError(
                f"{self.where}: cannot read it as Parquet ({type(error).__name__}: {error}); check that the "
                "file is complete and was written as Parquet"
            ) from None

    def _add_all(self, values: list[Any]) -> None:
        for value in values if self.room is None else values[: self.room]:
            if not isinstance(value, dict):
                name = "null" if value is None else type(value).__name__
                why = f'is a JSON {name}, not an object; one object per task, like {{"question": ...}}'
                self._unreadable("not an object", why)
            elif value_depth(value, MAX_ROW_DEPTH) > MAX_ROW_DEPTH:
                self._unreadable("too deep", f"nests values deeper than {MAX_ROW_DEPTH} levels")
            else:
                self._add(value)

    def _add(self, row: dict[str, Any]) -> None:
        self.loaded.rows.append(row)
        self.source.count += 1

    def _unreadable(self, kind: str, why: str, line: str = "") -> None:
        """Row ``source.count`` cannot be read (``why``): an error, or in skip mode an empty placeholder."""
        if not self.skip:
            raise TaskDataError(
                f"{self.where} row {self.source.count}{line} {why}. Fix the row, or set on_bad_row: skip to "
                "skip such rows (counted)"
            )
        self.loaded.unreadable[len(self.loaded.rows)] = (kind, why)
        self._add({})


def _not_json_constant(name: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity, which JSON does not have: a row holding one is bad."""
    raise ValueError(f"{name} is not JSON: write the value as a number or a string")


def _parse_line(raw: bytes) -> tuple[Any, tuple[str, str] | None]:
    """One JSON Lines row: ``(object, None)`` or ``(None, (kind, why))``."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, ("not UTF-8", f"is not UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})")
    depth = text_depth(line, MAX_ROW_DEPTH)
    if depth > MAX_ROW_DEPTH:
        return None, ("too deep", f"nests values {depth} levels deep (at most {MAX_ROW_DEPTH})")
    try:
        value = json.loads(line, parse_constant=_not_json_constant)
    except json.JSONDecodeError as error:
        return None, ("not JSON", f"is not valid JSON ({error.msg} at column {error.colno}): {line[:80]!r}")
    except ValueError as error:  # e.g. an integer of more than 4,300 digits
        return None, ("not JSON", f"cannot be read as JSON ({error})")
    if not isinstance(value, dict):
        name = "null" if value is None else type(value).__name__
        return None, ("not an object", f"is a JSON {name}, not an object")
    return value, None
