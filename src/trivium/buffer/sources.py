"""Where a task set's rows come from besides trivium's own file reader, and the row operators they pass.

``source_rows`` returns the rows of a path that ``task_files`` does not read itself, or None for one it does
(JSON Lines, JSON and Parquet files or folders of them: those keep their file-and-line error locations):

- a ``.csv`` file (Python's ``csv`` module: every value is a string; an empty cell is a missing value);
- a folder written by ``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` read at ``split``);
- a Hugging Face dataset id (``owner/name``) through ``datasets.load_dataset(path, subset, split=...,
  revision=...)``. Without network (``HF_HUB_OFFLINE=1``) only what is in the local cache loads; otherwise
  the error names the config field, the id and HF_HUB_OFFLINE. Loading scripts (``.py``) are not supported
  by the installed ``datasets`` (5.x dropped them); such a path is refused with that reason.

Task operators (``task_ops``) are functions ``op(rows, **args) -> rows`` over the list of row dicts,
registered in ``TASK_OPS`` or named ``module:function``; they run in order right after loading, before the
rows are checked against the workflow's fields. Built in: ``rename`` (columns), ``format_field`` (a new
field from a ``str.format`` template of others), ``length_filter`` (rows whose field is within a length in
characters), ``dedup`` (the first row of each distinct value of some fields), ``filter_value`` (rows whose
field equals, or is one of, given values).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trivium.buffer.task_files import SourcedRows, TaskDataError
from trivium.config.schema_data import looks_like_hub_id
from trivium.registry import Registry, callable_part

__all__ = ["TASK_OPS", "apply_task_ops", "section_rows", "source_rows"]

log = logging.getLogger(__name__)
_DATASET_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def source_rows(
    path: str,
    *,
    split: str = "train",
    subset: str | None = None,
    revision: str | None = None,
    field: str = "path",
) -> list[dict[str, Any]] | None:
    """The rows of ``path`` when it is a CSV file, a ``save_to_disk`` folder or a hub id; None otherwise.
    ``field`` is the config field that names ``path`` (for errors)."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".csv":
        return _csv_rows(p)
    if p.is_file() and p.suffix == ".py":
        raise TaskDataError(
            f"{field}: {path} is a dataset loading script; the installed datasets library no longer runs "
            "them. Convert the data to JSONL/Parquet/CSV, or save it with Dataset.save_to_disk and point "
            f"{field} at that folder"
        )
    if p.is_dir() and any((p / m).exists() for m in _DATASET_MARKERS):
        return _from_disk(p, split, field)
    if looks_like_hub_id(path, Path.cwd()):
        return _from_hub(path, split, subset, revision, field)
    return None


def section_rows(section: Any, name: str, field: str) -> list[dict[str, Any]] | None:
    """The rows of a dataset section of any role (a task set, SFT, preference or expert data: a config
    with ``path``, ``split``, ``subset``, ``revision``) after its ``task_ops`` if it has them, or None when
    the task reader can read its path itself and there are no operators. ``field``: the section's config
    path. Every role reads its data through here, so each takes every source a task set takes."""
    rows = source_rows(
        section.path,
        split=section.split,
        subset=section.subset,
        revision=section.revision,
        field=f"{field}.path",
    )
    ops = getattr(section, "task_ops", ())
    if ops:  # the task reader's own files are read here first: the operators need the rows
        if rows is None:
            from trivium.buffer.task_files import load_rows

            rows = load_rows(section.path, taskset=name, max_rows=section.max_rows).rows
        rows = apply_task_ops(rows, ops, taskset=name)
    return rows


CSV_CELL_LIMIT = 64 * 2**20  # characters; Python's csv module stops at 131,072 by default


def _csv_rows(path: Path) -> SourcedRows:
    """Every row of a CSV file as a dict (an empty cell is a missing value), with each row's line. UTF-8
    (with or without a byte-order mark) or UTF-16 with its mark; other encodings are refused with the
    way out, as are cells over ``CSV_CELL_LIMIT`` characters and malformed quoting."""
    head = path.read_bytes()[:4]
    encoding = "utf-16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    csv.field_size_limit(CSV_CELL_LIMIT)
    rows, lines = [], []
    with open(path, newline="", encoding=encoding) as f:
        reader = csv.DictReader(f)
        try:
            for row in reader:
                rows.append({k: (v if v != "" else None) for k, v in row.items() if k is not None})
                lines.append(reader.line_num)
        except UnicodeDecodeError as error:
            raise TaskDataError(
                f"{path}: byte {error.start} of the file (after line {reader.line_num}) is not {encoding}: the "
                f"file is in another encoding (latin-1, cp1252, ...). Save it as UTF-8, e.g. "
                f"`iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8.csv`"
            ) from None
        except csv.Error as error:
            limit = "larger than field limit" in str(error)
            why = f"a cell longer than {CSV_CELL_LIMIT:,} characters" if limit else f"malformed CSV ({error})"
            raise TaskDataError(
                f"{path} line {reader.line_num + 1}: {why}; fix that row, or convert the file to JSON Lines"
            ) from None
    return SourcedRows(rows, str(path), lines)


def _from_disk(path: Path, split: str, field: str) -> list[dict[str, Any]]:
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise TaskDataError(
                f"{field}: the dataset folder {path} has splits {sorted(data)}, not {split!r}; set the task "
                "set's split"
            )
        data = data[split]
    return SourcedRows([dict(row) for row in data], f"{path} (split {split!r})")


def _from_hub(
    path: str, split: str, subset: str | None, revision: str | None, field: str
) -> list[dict[str, Any]]:
    import datasets
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if path.lower() in _PACKAGED_DATASETS_MODULES:
        # load_dataset("parquet") with no data files globs the working directory, all of it, recursively
        raise TaskDataError(
            f"{field}: {path!r} is the name of a file format (a datasets builder), not a dataset or a "
            f"file; point {field} at the data file or folder itself (e.g. data/train.{path.lower()})"
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
    try:
        data = datasets.load_dataset(path, subset, split=split, revision=revision)
    except Exception as exc:  # no network, unknown id, missing split: say which field and what to do
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        where = (
            "HF_HUB_OFFLINE=1 is set, so only datasets in the local cache load"
            if offline
            else "the Hub could not be reached or has no such dataset (HF_HUB_OFFLINE is unset)"
        )
        raise TaskDataError(
            f"{field}: {path!r} is not a local file or folder, so it was loaded as a Hugging Face dataset id "
            f"(subset={subset!r}, split={split!r}, revision={revision!r}) and that failed ({why}); {where}. "
            "Fix the path if it is a local file, download the dataset while online (it is then cached), or "
            "save it with Dataset.save_to_disk and point the field at that folder"
        ) from exc
    return SourcedRows([dict(row) for row in data], f"{path} (split {split!r})")


TASK_OPS: Registry = Registry(
    "task operator", doc="a function op(rows: list[dict], **args) -> list[dict]", check=callable_part
)


def apply_task_ops(rows: list[dict[str, Any]], ops: Sequence[Any], *, taskset: str) -> list[dict[str, Any]]:
    """Run ``ops`` (``{name, args}`` configs) over ``rows`` in order; logs each one's kept and dropped rows."""
    for i, op in enumerate(ops):
        before = len(rows)
        try:
            fn = TASK_OPS.get(op.name)
            rows = list(fn([dict(r) for r in rows], **op.args))
        except (KeyError, TypeError, ValueError) as exc:
            raise TaskDataError(f"task set {taskset!r}: task_ops[{i}] ({op.name}) failed: {exc}") from exc
        bad = next((r for r in rows if not isinstance(r, Mapping)), None)
        if bad is not None:
            raise TaskDataError(
                f"task set {taskset!r}: task_ops[{i}] ({op.name}) returned a {type(bad).__name__}, not a row dict"
            )
        log.info("task set %r: task_ops[%d] %s kept %d of %d rows", taskset, i, op.name, len(rows), before)
    return rows


@TASK_OPS.register("rename")
def rename(rows: list[dict], mapping: Mapping[str, str]) -> list[dict]:
    """Rename columns: ``mapping`` {old: new}; a row without ``old`` is left as it is."""
    return [{mapping.get(k, k): v for k, v in row.items()} for row in rows]


@TASK_OPS.register("format_field")
def format_field(rows: list[dict], field: str, template: str) -> list[dict]:
    """Set ``field`` to ``template.format(**row)``, e.g. ``{question}\\nOptions: {choices}``."""
    return [{**row, field: template.format(**row)} for row in rows]


@TASK_OPS.register("length_filter")
def length_filter(
    rows: list[dict], field: str, min_chars: int = 0, max_chars: int | None = None
) -> list[dict]:
    """Keep rows whose ``str(row[field])`` has between ``min_chars`` and ``max_chars`` characters."""
    out = []
    for row in rows:
        n = len(str(row.get(field, "")))
        if n >= min_chars and (max_chars is None or n <= max_chars):
            out.append(row)
    return out


@TASK_OPS.register("dedup")
def dedup(rows: list[dict], fields: Sequence[str], normalize: bool = True) -> list[dict]:
    """Keep the first row of each distinct ``fields`` value (whitespace- and case-normalised by default)."""
    seen, out = set(), []
    for row in rows:
        key = tuple(_norm(row.get(f), normalize) for f in fields)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


@TASK_OPS.register("filter_value")
def filter_value(rows: list[dict], field: str, keep: Any) -> list[dict]:
    """Keep rows whose ``field`` equals ``keep`` (or is in it, when ``keep`` is a list)."""
    allowed = keep if isinstance(keep, list) else [keep]
    return [row for row in rows if row.get(field) in allowed]


def _norm(value: Any, normalize: bool) -> Any:
    if normalize and isinstance(value, str):
        return " ".join(value.split()).lower()
    return repr(value)
