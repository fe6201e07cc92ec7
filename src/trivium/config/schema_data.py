"""Config of the data pipeline (docs/data.md): task sources and their mixing, task selection, and the
operators that rows and experiences pass through. ``schema.py``'s ``TaskSetConfig`` and ``BufferConfig``
inherit these fields."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from trivium.config.schema_base import StrictModel


class OperatorConfig(StrictModel):
    """One step of an operator pipeline: a registered operator (or ``module:function``) and its arguments."""

    name: str
    """Registered operator name or 'package.module:function' (see docs/data.md for the built-in ones)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the operator."""


class HubSourceFields(StrictModel):
    """Which part of a Hugging Face dataset a path names (a hub id or a save_to_disk folder): every dataset
    role (task sets, SFT, preference and expert data) reads its path through one reader
    (``buffer/sources.py``)."""

    split: str = "train"
    """The split of a Hugging Face dataset (id or save_to_disk folder); files are one split."""
    subset: str | None = None
    """Hugging Face dataset configuration (datasets.load_dataset's name) when path is a hub id."""
    revision: str | None = None
    """Hugging Face dataset revision (branch, tag or commit) when path is a hub id."""


class TaskSourceFields(HubSourceFields):
    """Where a task set's rows come from besides a local file, how much of the mix it is, and its row ops."""

    weight: float = Field(1.0, gt=0)
    """Share of the tasks drawn from this set when buffer.tasksets lists several (normalised over the list)."""
    task_ops: list[OperatorConfig] = Field(default_factory=list)
    """Row operators run in order after loading, before the rows are checked: field transforms, filters,
    deduplication, or your own 'module:function' (docs/data.md)."""


class BufferDataFields(StrictModel):
    """The buffer's data-pipeline fields. With ``tasksets``, ``taskset`` is its first entry (what sizes a step:
    repeat_times, the workflow): set one of the two."""

    @model_validator(mode="before")
    @classmethod
    def _first_taskset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("tasksets") and data.get("taskset") is None:
            first = data["tasksets"][0]
            data = {**data, "taskset": first.model_dump() if isinstance(first, StrictModel) else first}
        return data

    @model_validator(mode="after")
    def _one_of_taskset_and_tasksets(self) -> BufferDataFields:
        tasksets, taskset = getattr(self, "tasksets", []), getattr(self, "taskset", None)
        if tasksets and taskset != tasksets[0]:
            raise ValueError(
                "buffer.taskset and buffer.tasksets are both set: list every task set under tasksets and "
                "remove taskset (in a stage too: tasksets does not replace a taskset inherited from the top level)"
            )
        if len({ts.repeat_times for ts in tasksets}) > 1:
            raise ValueError(
                "buffer.tasksets: every task set needs the same repeat_times (one step is batch_size groups "
                f"of repeat_times samples), got {[ts.repeat_times for ts in tasksets]}"
            )
        return self

    selector: str | None = None
    """Which tasks run next: sequential, shuffle, random, curriculum, online_difficulty, or
    'module:Class'. Unset: shuffle, or sequential for a task set with shuffle false (docs/data.md)."""
    selector_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the selector (e.g. target for online_difficulty, difficulty_field for curriculum)."""
    experience_ops: list[OperatorConfig] = Field(default_factory=list)
    """Operators every explore step's groups pass through, in order, before they reach the buffer:
    filters and reward shapers, or your own 'module:function' (docs/data.md)."""


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".py")


def looks_like_hub_id(path: str, base_dir: Path) -> bool:
    """Whether a task set's ``path`` names a Hugging Face dataset id ('owner/name' or 'name'), not a local
    file: nothing of that name exists next to the config, it has no data-file suffix and no leading '.'."""
    return (
        bool(_HUB_ID.fullmatch(path))
        and not path.endswith(_FILE_SUFFIXES)
        and not (base_dir / path).exists()
        and not Path(path).exists()
    )
