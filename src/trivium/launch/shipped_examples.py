"""The examples that ship with the package: ``trivium example`` lists them, ``trivium example NAME`` copies
one into ``examples/NAME`` of the current folder (``--into DIR``: of another), with the examples it reads
from (``../quickstart/data/...`` in its configs), so that the README's commands run there as they are
written (``trivium run --config examples/quickstart/grpo_word_problems.yaml``, runs under ``./runs``).

A wheel carries the repository's ``examples/`` as ``trivium/examples`` (pyproject.toml maps the package);
an editable install reads the checkout's ``examples/`` in place.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import trivium


class ExampleError(ValueError):
    """An unknown example, or a destination that already exists."""


@dataclass(frozen=True)
class Example:
    name: str
    folder: Path
    configs: tuple[str, ...]  # the YAML files of the folder, relative to it
    summary: str  # the first sentence of the first config's opening comment
    needs: tuple[str, ...]  # the other examples its configs read from (``../NAME/...``)


def examples_root() -> Path:
    """The folder that holds the examples: inside the installed package (wheel), else the checkout's."""
    package = Path(trivium.__file__).resolve().parent
    for root in (package / "examples", package.parents[1] / "examples"):
        if root.is_dir():
            return root
    raise ExampleError(
        f"no examples found next to the trivium package ({package}): this install carries none; "
        "reinstall from a wheel or a checkout of the repository"
    )


def list_examples(root: Path | None = None) -> list[Example]:
    """Every example folder (one with a YAML config at its top), by name."""
    root = root or examples_root()
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    names = {p.name for p in folders}
    found = []
    for folder in folders:
        configs = tuple(sorted(p.name for p in folder.glob("*.yaml")))
        if configs:
            texts = [(folder / c).read_text(encoding="utf-8") for c in configs]
            needs = {m for t in texts for m in _SIBLING.findall(t) if m in names and m != folder.name}
            found.append(Example(folder.name, folder, configs, _summary(texts[0]), tuple(sorted(needs))))
    return found


def copy_example(
    name: str, into: Path = Path("."), root: Path | None = None
) -> tuple[list[Path], list[Path]]:
    """Copy the example ``name`` to ``into/examples/NAME``, and the examples it reads from unless ``into``
    has them already; returns (the folders written, the ones kept). ``into/examples/NAME`` must not exist."""
    examples = {e.name: e for e in list_examples(root)}
    if name not in examples:
        raise ExampleError(f"no example named {name!r}; the examples are: {', '.join(examples)}")
    target = Path(into) / "examples"
    if (target / name).exists():
        raise ExampleError(
            f"{target / name} already exists: remove it first, or copy into another folder with --into DIR "
            "(nothing was written)"
        )
    written, kept = [], []
    for each in (name, *examples[name].needs):
        dest = target / each
        if dest.exists():
            kept.append(dest)
            continue
        shutil.copytree(examples[each].folder, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        written.append(dest)
    return written, kept


# a config's path into another example: ../quickstart/data/train.jsonl
_SIBLING = re.compile(r"\.\./([A-Za-z0-9_-]+)/")


def _summary(config_text: str) -> str:
    """The first sentence of the config's opening comment."""
    words = []
    for line in config_text.splitlines():
        if not line.startswith("#") or (words and not line.lstrip("#").strip()):
            break
        words.extend(line.lstrip("#").split())
    text = " ".join(words)
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]
