"""Checks of values that come from outside and must never crash a process: paths no file system accepts,
temperatures that overflow the sampler, environment arguments, and the rows of every data file.

Like ``validate.py``: pure, every check returns problems naming the field. ``check_data_files`` reads the
data files (``trivium check-config`` runs it; ``trivium run`` reads them anyway before its first step).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trivium.config.errors import Problem, join_path
from trivium.config.schema import MIN_TEMPERATURE, TaskSetConfig, TriviumConfig

__all__ = ["check_data_files", "check_paths", "check_values"]

MAX_PATH_BYTES = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX: one file or folder name


def check_paths(cfg: TriviumConfig, prefix: str = "") -> list[Problem]:
    """Paths that no file system accepts (a NUL byte, over ``MAX_PATH_BYTES``, a name over
    ``MAX_NAME_BYTES``, not encodable): ``Path.exists`` and ``resolve`` raise on them instead of answering,
    so they are refused before anything looks at the disk."""
    out = []
    for field, value in _path_fields(cfg):
        rule = _unusable_path(value)
        if rule:
            where = join_path(prefix, field) if prefix else field
            out.append(Problem(where, value, rule, "write a path the file system accepts"))
    return out


def _path_fields(cfg: TriviumConfig) -> list[tuple[str, str]]:
    b, m = cfg.buffer, cfg.model
    fields = [
        ("project", cfg.project),
        ("name", cfg.name),
        ("checkpoint_root", cfg.checkpoint_root),
        ("model.path", m.path),
        ("algorithm.critic.path", cfg.algorithm.critic.path or ""),
        ("synchronizer.checkpoint_dir", cfg.synchronizer.checkpoint_dir),
        ("bench.checkpoint_dir", cfg.bench.checkpoint_dir or ""),
    ]
    fields += [(f"auxiliary_models[{i}].path", a.path) for i, a in enumerate(cfg.auxiliary_models)]
    if m.tiny is not None:
        fields += [(f"model.tiny.corpus[{i}]", p) for i, p in enumerate(m.tiny.corpus)]
    if b.storage is not None and "://" not in b.storage.url:
        fields.append(("buffer.storage.url", b.storage.url))
    for name in ("taskset", "sft_dataset", "preference_dataset", "expert_dataset"):
        section = getattr(b, name)
        if section is not None:
            fields.append((f"buffer.{name}.path", section.path))
    fields += [(f"buffer.eval_tasksets[{i}].path", ts.path) for i, ts in enumerate(b.eval_tasksets)]
    return fields


def _unusable_path(path: str) -> str:
    """Why ``path`` cannot be a path, or ''."""
    if "\x00" in path:
        return "a path cannot contain a NUL character"
    try:
        data = os.fsencode(path)
    except UnicodeError as exc:
        return f"the path cannot be encoded for the file system: {exc.reason}"
    if len(data) > MAX_PATH_BYTES:
        return f"the path has {len(data)} bytes; the file system takes at most {MAX_PATH_BYTES}"
    longest = max((len(part) for part in data.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        return f"a name in the path has {longest} bytes; the file system takes at most {MAX_NAME_BYTES}"
    return ""


def check_values(cfg: TriviumConfig, prefix: str = "") -> list[Problem]:
    """Values in range for their field but unusable: a temperature between 0 and ``MIN_TEMPERATURE``."""
    out = []
    for field, value in (
        ("explorer.rollout.temperature", cfg.explorer.rollout.temperature),
        ("explorer.eval.temperature", cfg.explorer.eval.temperature),
    ):
        if 0 < value < MIN_TEMPERATURE:
            out.append(
                Problem(
                    join_path(prefix, field) if prefix else field,
                    value,
                    f"a temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}: smaller ones overflow the "
                    "scaled logits",
                    "use 0 for greedy decoding",
                )
            )
    return out


def check_data_files(cfg: TriviumConfig, prefix: str = "") -> list[Problem]:
    """Read every task set and dataset that ``cfg.mode`` reads, as a run would before its first step (every
    row checked; see ``buffer/task_reader.py``): what ``trivium check-config`` adds to the field checks, so
    that a file a run would refuse is refused here too. Rows skipped by ``on_bad_row: skip`` are logged."""
    from trivium.buffer.offline import PREFERENCE_FIELDS, SFT_FORMATS
    from trivium.buffer.sources import section_rows
    from trivium.buffer.task_files import TaskDataError
    from trivium.buffer.task_reader import TaskSetReader
    from trivium.rewards.registry import reward_task_fields
    from trivium.workflows.registry import WORKFLOWS

    def at(path: str) -> str:
        return join_path(prefix, path) if prefix else path

    b = cfg.buffer
    wanted: list[tuple[str, Any, dict[str, tuple[type, ...]], bool]] = []  # field, section, required, all
    if cfg.mode in ("both", "explore") and b.taskset is not None:
        wanted.append(("buffer.taskset", b.taskset, {}, False))
        wanted += [(f"buffer.tasksets[{i}]", ts, {}, False) for i, ts in enumerate(b.tasksets) if i > 0]
    wanted += [(f"buffer.eval_tasksets[{i}]", ts, {}, False) for i, ts in enumerate(b.eval_tasksets)]
    if cfg.mode == "train" and b.sft_dataset is not None:
        wanted.append(("buffer.sft_dataset", b.sft_dataset, SFT_FORMATS[b.sft_dataset.format], False))
    if cfg.mode == "train" and b.preference_dataset is not None:
        wanted.append(("buffer.preference_dataset", b.preference_dataset, PREFERENCE_FIELDS, False))
    out = []
    for field, section, required, all_columns in wanted:
        if isinstance(section, TaskSetConfig):
            if WORKFLOWS.problem(section.workflow):
                continue  # reported by check_semantics
            workflow = WORKFLOWS.get(section.workflow)
            required, all_columns = dict(workflow.fields), workflow.reads_all_columns
        optional = reward_task_fields(section.reward_fn) if isinstance(section, TaskSetConfig) else ()
        fields = {**{k: k for k in (*required, *optional)}, **section.fields}
        name = getattr(section, "name", "") or Path(section.path).stem or field
        try:
            rows = section_rows(section, name, field)
            reader = TaskSetReader(
                section.path if rows is None else rows,
                name=name,
                fields=fields,
                required=required,
                workflow="check",
                reward_fn="check",
                repeat_times=1,
                on_bad_row=section.on_bad_row,
                shuffle=False,
                max_rows=section.max_rows,
                all_columns=all_columns,
            )
        except TaskDataError as exc:
            out.append(
                Problem(at(field + ".path"), section.path, str(exc), "fix the file or the field mapping")
            )
            continue
        if getattr(section, "on_long_row", None) == "error":
            out += _long_rows(cfg, section, reader, at(field))
    return out


def _long_rows(cfg: TriviumConfig, section, reader, field: str) -> list[Problem]:
    """A task set with ``on_long_row: error`` whose rows render to prompts that fill the model's context: the
    run would stop at the first; named here, with their lengths, where the model's folder is local."""
    from trivium.workflows.registry import prompt_lengths

    folder = Path(cfg.model.path) if cfg.model.path else None
    if folder is None or not (folder / "config.json").exists():
        return []  # a hub id or a recipe: the context is known at run time
    from transformers import AutoConfig

    from trivium.models.chat import char_budget
    from trivium.models.loading import load_tokenizer

    context = getattr(AutoConfig.from_pretrained(folder).get_text_config(), "max_position_embeddings", None)
    if not context:
        return []
    tasks = reader.all_tasks()
    tokenizer = load_tokenizer(folder)
    lengths = prompt_lengths(tasks, section.workflow, section.workflow_args, tokenizer, cap=context)
    long = [(t.index, n) for t, n in zip(tasks, lengths) if n is None or n >= context]
    if not long:
        return []
    over = f"over {char_budget(tokenizer, context)} characters, so at least {context} tokens"
    sizes = [f"{n} tokens" if n is not None else over for _, n in long[:5]]
    shown = ", ".join(f"row {i} ({size})" for (i, _), size in zip(long, sizes)) + (
        " ..." if len(long) > 5 else ""
    )
    return [
        Problem(
            f"{field}.on_long_row",
            "error",
            f"{len(long)} row(s) render to prompts at or over the model's context of {context} tokens: "
            f"{shown}; the run would stop at the first",
            "shorten them, or set on_long_row: skip (drop and count them) or truncate",
        )
    ]
