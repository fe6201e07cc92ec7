"""Read a task set's rows from local JSON Lines / JSON / Parquet files, remembering where each row came from.

Design decisions:
- HF ``datasets.load_dataset("json" | "parquet", data_files=...)`` reads the files (typed columns, Arrow
  cache). It is imported on first use, so importing ``trivium.buffer`` stays cheap.
- Rows end up as plain dicts: every row is validated up front anyway, and a dict is what ``Task.raw`` holds.
- HF's JSON reader rejects some valid files (a blank line plus a column of mixed types raises "Expected
  object or value") and never says which line is bad. When it fails, the ``json`` module reads the file:
  a bad line becomes a ``TaskDataError`` naming it, and a valid file is used as the stdlib read it.
- A folder means every ``.jsonl`` / ``.json`` / ``.parquet`` file directly inside it, in name order, one
  task set. Subfolders are not read, so a stray ``old/`` copy is never trained on by accident.
- Line numbers (JSON Lines only) are computed only when an error needs them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MEMORY", "LoadedRows", "RowLocation", "TaskDataError", "load_rows"]

MEMORY = "<memory>"  # the file name of rows given as a Python list
_LOADERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class TaskDataError(ValueError):
    """A task set's data cannot be used as configured; the message names the file, row, field and fix."""


@dataclass(frozen=True)
class RowLocation:
    file: str
    row: int  # 0-based row index within the file
    line: int | None  # 1-based line number (JSON Lines only)

    def __str__(self) -> str:
        return f"{self.file} row {self.row}" + (f" (line {self.line})" if self.line is not None else "")


@dataclass
class _Source:
    name: str  # path as given by the user, or MEMORY
    path: Path | None
    start: int  # index of its first row among all rows of the task set
    count: int


@dataclass
class LoadedRows:
    rows: list[dict[str, Any]]
    sources: list[_Source]
    _lines: dict[str, list[int]] = field(default_factory=dict)

    def locate(self, index: int) -> RowLocation:
        """Where task-set row ``index`` (0-based, across all files) came from."""
        source = next(s for s in self.sources if s.start <= index < s.start + s.count)
        row = index - source.start
        line = None
        if source.path is not None and source.path.suffix == ".jsonl":
            if source.name not in self._lines:
                self._lines[source.name] = _jsonl_line_numbers(source.path)
            lines = self._lines[source.name]
            line = lines[row] if row < len(lines) else None
        return RowLocation(source.name, row, line)


def load_rows(
    source: str | os.PathLike[str] | Sequence[Mapping[str, Any]], *, split: str, taskset: str
) -> LoadedRows:
    """All rows of ``source`` (a file, a folder of files, or a list of dicts) in file order."""
    if not isinstance(source, (str, os.PathLike)):
        rows = [dict(r) if isinstance(r, Mapping) else r for r in source]
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        if bad is not None:
            raise TaskDataError(
                f"task set {taskset!r}: {MEMORY} row {bad} is a {type(rows[bad]).__name__}, not a dict; "
                "pass a list of dicts (one per task)"
            )
        return LoadedRows(rows, [_Source(MEMORY, None, 0, len(rows))])
    rows, sources = [], []
    for path in _resolve_files(Path(source), taskset):
        file_rows = _read_file(path, split, taskset)
        sources.append(_Source(str(path), path, len(rows), len(file_rows)))
        rows.extend(file_rows)
    return LoadedRows(rows, sources)


def _resolve_files(path: Path, taskset: str) -> list[Path]:
    supported = ", ".join(_LOADERS)
    if not path.exists():
        raise FileNotFoundError(
            f"task set {taskset!r}: path {str(path)!r} does not exist (resolved to {path.resolve()}); "
            f"set path to a {supported} file or a folder of them"
        )
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _LOADERS)
        if not files:
            found = sorted(p.name for p in path.iterdir())[:10]
            raise TaskDataError(
                f"task set {taskset!r}: folder {str(path)!r} has no {supported} files directly inside "
                f"(found {found}); point path at a data file or at the folder that holds them"
            )
        return files
    if path.suffix not in _LOADERS:
        raise TaskDataError(
            f"task set {taskset!r}: {str(path)!r} has extension {path.suffix!r}; supported: {supported}. "
            "Convert the file or rename it if it already is one of these formats"
        )
    return [path]


def _read_file(path: Path, split: str, taskset: str) -> list[dict[str, Any]]:
    from datasets import load_dataset

    kind = _LOADERS[path.suffix]
    try:
        return load_dataset(kind, data_files={split: str(path)}, split=split).to_list()
    except Exception as error:
        if kind != "json":
            raise TaskDataError(
                f"task set {taskset!r}: cannot read {str(path)!r} as Parquet ({type(error).__name__}: "
                f"{error}); check that the file is complete and was written as Parquet"
            ) from error
        return _read_json_stdlib(path, taskset, error)


def _read_json_stdlib(path: Path, taskset: str, hf_error: Exception) -> list[dict[str, Any]]:
    where = f"task set {taskset!r}: {str(path)!r}"
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows: list[Any] = []
        for line_no, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise TaskDataError(
                    f"{where} row {len(rows)} (line {line_no}) is not valid JSON ({error.msg} at column "
                    f"{error.colno}): {line[:80]!r}; JSON Lines needs one JSON object per line"
                ) from hf_error
            if not isinstance(rows[-1], dict):
                raise TaskDataError(
                    f"{where} row {len(rows) - 1} (line {line_no}) is a JSON {type(rows[-1]).__name__}, "
                    'not an object; JSON Lines needs one object per line, like {"question": ...}'
                ) from hf_error
        return rows
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise TaskDataError(
            f"{where} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        ) from hf_error
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise TaskDataError(
            f'{where} must hold a JSON list of objects (one per task), e.g. [{{"question": ...}}]; '
            f"HF datasets said: {type(hf_error).__name__}: {hf_error}"
        ) from hf_error
    return data


def _jsonl_line_numbers(path: Path) -> list[int]:
    """1-based line number of each row of a JSON Lines file (blank lines hold no row)."""
    lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines(): JSON strings may hold \u2028
    return [n for n, line in enumerate(lines, start=1) if line.strip()]
