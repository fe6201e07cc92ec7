"""``--set key.path=value`` overrides applied to a loaded YAML config, and the merge of a stage over the top
level: plain data, before any validation (``trivium.validation.load``)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from trivium.config.errors import ConfigError, Problem
from trivium.config.safe_yaml import MAX_DEPTH, safe_yaml, shown

__all__ = ["apply_overrides", "deep_merge"]


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML; ``stages.1.trainer.lr=1e-5`` indexes lists)."""
    raw = copy.deepcopy(raw)
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(
                Problem(
                    shown(item),
                    shown(item),
                    "an override must look like key.path=value",
                    "e.g. --set trainer.lr=1e-5",
                )
            )
            continue
        parts = key.strip().replace("[", ".").replace("]", "").split(".")
        if len(parts) > MAX_DEPTH:
            problems.append(Problem(shown(key), shown(text), f"the key path has over {MAX_DEPTH} parts", ""))
            continue
        try:
            value = _parse_value(text)
        except yaml.YAMLError as exc:
            problems.append(
                Problem(
                    shown(key),
                    shown(text),
                    f"not a YAML value: {str(exc).splitlines()[0]}",
                    f"quote a text value: --set '{shown(key, 60)}=\"...\"'",
                )
            )
            continue
        node: Any = raw
        try:
            for part in parts[:-1]:
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            last = parts[-1]
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        except (ValueError, IndexError, TypeError, AttributeError):
            problems.append(
                Problem(
                    shown(key),
                    shown(text),
                    "the key path does not lead to a settable field",
                    "check the path",
                )
            )
    if problems:
        raise ConfigError(problems, "--set overrides")
    return raw


def _parse_value(text: str) -> Any:
    """YAML value, with unquoted numbers YAML 1.1 reads as strings (``1e-5``) turned into floats; a quoted
    value stays text (``--set 'name="123"'``). Text starting with ``@`` or a backtick (characters YAML
    reserves) is a string: ``--set model.path=@org/model``."""
    if text.lstrip().startswith(("@", "`")):
        return text.strip()
    value = safe_yaml(text)
    if isinstance(value, str) and not text.strip().startswith(("'", '"')):
        try:
            return float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            return value
    return value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
