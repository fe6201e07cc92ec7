"""Read a YAML config safely: a small UTF-8 file, nesting and aliases bounded before anything is built.

A config may come from anywhere; each way a file can be bad is a ``ConfigError`` naming the file, never a
traceback:
- The file is read as bytes, at most ``MAX_CONFIG_BYTES``, and decoded as strict UTF-8 (a UTF-16 file or a
  stray byte is named with its offset and line) before YAML sees it; a path with a NUL byte or a name too
  long for the file system is named too.
- YAML is composed (the node graph, aliases still shared) before anything is built, so that nesting deeper
  than ``MAX_DEPTH`` and alias "bombs" (a few hundred bytes whose aliases expand to millions of values once
  pydantic or ``deepcopy`` walks them) are refused cheaply, counting the *expanded* size without expanding.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from trivium.config.errors import ConfigError, Problem

__all__ = ["MAX_CONFIG_BYTES", "MAX_DEPTH", "MAX_NODES", "load_yaml", "safe_yaml", "shown"]

MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; 1 MiB is far beyond any real one
MAX_DEPTH = 64  # nesting levels of YAML values (aliases expanded); real configs use < 10
MAX_NODES = 100_000  # YAML values once aliases are expanded; real configs have a few hundred


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path``, or a ``ConfigError`` saying why there is none."""
    where = shown(str(path))
    text = _read_text(Path(path), where)
    try:
        raw = safe_yaml(text, where)
    except yaml.YAMLError as exc:
        fix = "fix the YAML (syntax, nesting, aliases) at the place shown"
        raise ConfigError([Problem("", where, f"not valid YAML: {exc}", fix)], where) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([Problem("", type(raw).__name__, "the top level must be a mapping", "")], where)
    return raw


def _read_text(path: Path, where: str) -> str:
    """The file's text: checked to be a readable, small, UTF-8 file first (``where`` names it)."""
    try:
        size = path.stat().st_size if path.is_file() else None
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long for the file system, ...
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigError(
            [Problem("", where, f"cannot use this path: {why}", "check --config")], where
        ) from None
    if size is None:
        raise ConfigError(
            [Problem("", where, "config file not found", "check the path after --config")], where
        )
    if size > MAX_CONFIG_BYTES:
        rule = f"the file has {size} bytes, over the {MAX_CONFIG_BYTES} allowed for a config"
        raise ConfigError([Problem("", where, rule, "is this the config file?")], where)
    try:
        data = path.read_bytes()[: MAX_CONFIG_BYTES + 1]
    except OSError as exc:
        raise ConfigError(
            [Problem("", where, f"cannot read the file: {exc.strerror}", "check its permissions")], where
        ) from None
    return decode_utf8(data, where)


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 (a UTF-8 byte-order mark is dropped); otherwise a ``ConfigError`` naming the byte."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        rule = "the file is UTF-16 (it starts with a UTF-16 byte-order mark)"
        raise ConfigError([Problem("", where, rule, "save it as UTF-8")], where)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            [
                Problem(
                    "",
                    where,
                    f"not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} (line {line}) {exc.reason}",
                    "save the file as UTF-8",
                )
            ],
            where,
        ) from None


class _LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses nesting deeper than ``MAX_DEPTH`` while composing (PyYAML's composer
    recurses once per level, so 1,000 levels would otherwise end in a RecursionError)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"values are nested deeper than {MAX_DEPTH} levels", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def safe_yaml(text: str, name: str = "<text>") -> Any:
    """``yaml.safe_load(text)`` within ``MAX_DEPTH`` and ``MAX_NODES`` (aliases expanded); a
    ``yaml.YAMLError`` (its marks name ``name``) otherwise, raised before any value is built."""
    loader = _LimitedLoader(text)
    loader.name = name
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expanded(root: yaml.Node) -> None:
    """Count the values and the depth of ``root`` as they will be once aliases are expanded (a shared node
    counts once per reference), without expanding anything: sizes are memoised per node."""
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth)
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = [memo[id(k)] for k in _children(node)]
            size, depth = 1 + sum(k[0] for k in kids), 1 + max((k[1] for k in kids), default=0)
            memo[key] = (size, depth)
            open_nodes.discard(key)
            if size > MAX_NODES or depth > MAX_DEPTH:
                what = f"{size} values" if size > MAX_NODES else f"{depth} levels deep"
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"with its aliases expanded this value holds {what} (limits: {MAX_NODES} values, "
                    f"{MAX_DEPTH} levels); is it an alias bomb?",
                    node.start_mark,
                )
        elif key not in memo:
            if key in open_nodes:
                raise yaml.composer.ComposerError(
                    None, None, "an alias refers to a value that contains it", node.start_mark
                )
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((k, False) for k in _children(node) if id(k) not in memo)


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        yield from node.value
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value


def shown(text: str, limit: int = 200) -> str:
    """A user-given string short enough to quote in a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
