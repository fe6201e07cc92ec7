"""Load a YAML config, apply ``--set`` overrides, expand stages, and validate everything at once.

Pure but for one thing: reading the YAML file is the only I/O, and the modules listed under `plugins`
are imported (they register the parts the config names); nothing is created, downloaded or started here.
"""

from __future__ import annotations

import copy
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trivium.config.errors import ConfigError, Problem, did_you_mean, join_path
from trivium.config.schema import TriviumConfig

# Top-level keys that a stage may not change: they name the run folder shared by all stages.
RUN_LEVEL_KEYS = ("project", "name", "checkpoint_root", "stages", "plugins", "runtime")


@dataclass(frozen=True)
class Stage:
    name: str
    config: TriviumConfig  # complete config of this stage (stages list emptied, paths absolute)


@dataclass(frozen=True)
class RunConfig:
    """A validated run: the top-level config and the stages it runs, in order."""

    config: TriviumConfig
    stages: tuple[Stage, ...]
    source: str  # the YAML file, for messages


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([Problem("", str(path), "config file not found", "check the path after --config")])
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError([Problem("", str(path), f"not valid YAML: {exc}", "fix the YAML syntax")]) from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([Problem("", type(raw).__name__, "the top level must be a mapping", "")], str(path))
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML; ``stages.1.trainer.lr=1e-5`` indexes lists)."""
    raw = copy.deepcopy(raw)
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(
                Problem(item, item, "an override must look like key.path=value", "e.g. --set trainer.lr=1e-5")
            )
            continue
        parts = key.strip().replace("[", ".").replace("]", "").split(".")
        node: Any = raw
        try:
            for part in parts[:-1]:
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            last = parts[-1]
            value = _parse_value(text)
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        except (ValueError, IndexError, TypeError, AttributeError):
            problems.append(
                Problem(key, text, "the key path does not lead to a settable field", "check the path")
            )
    if problems:
        raise ConfigError(problems, "--set overrides")
    return raw


def _parse_value(text: str) -> Any:
    """YAML value, with numbers YAML 1.1 reads as strings (``1e-5``) turned into floats."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            return value
    return value


def _dedupe(problems: list[Problem]) -> list[Problem]:
    """Drop repeats of one problem that every stage inherits from the top level (same field, same value)."""
    seen, out = set(), []
    for p in problems:
        key = (p.path.split("].", 1)[-1] if p.path.startswith("stages[") else p.path, repr(p.value), p.rule)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_config(path: str | Path, overrides: list[str] | None = None, check_files: bool = True) -> RunConfig:
    """Load, override, expand stages and validate. Raises one ``ConfigError`` listing every problem."""
    raw = apply_overrides(load_yaml(path), overrides or [])
    return validate_raw(raw, base_dir=Path(path).resolve().parent, source=str(path), check_files=check_files)


def validate_raw(
    raw: dict[str, Any], base_dir: Path, source: str = "config", check_files: bool = True
) -> RunConfig:
    from trivium.config.validate import check_semantics, resolve_paths

    problems: list[Problem] = []
    top = _validate_model(raw, (), problems)
    if top is None:
        raise ConfigError(problems, source)
    problems += load_plugins(top.plugins, base_dir)
    stage_raws: list[tuple[str, str | int, dict[str, Any]]] = []
    if not top.stages:
        stage_raws.append(("main", "", raw))
    for i, stage in enumerate(top.stages):
        prefix = join_path("stages", i)
        name = stage.get("name")
        if not isinstance(name, str) or not name:
            problems.append(
                Problem(prefix + ".name", name, "every stage needs a non-empty name", "add name: sft")
            )
            name = f"stage{i}"
        bad = [k for k in stage if k in RUN_LEVEL_KEYS and k != "name"]  # a stage's 'name' is its own
        for k in bad:
            problems.append(
                Problem(
                    prefix + f".{k}",
                    stage[k],
                    "a stage cannot change run-level keys",
                    "set it at the top level",
                )
            )
        body = {k: v for k, v in stage.items() if k != "name" and k not in RUN_LEVEL_KEYS}
        base = {k: v for k, v in raw.items() if k != "stages"}
        stage_raws.append((name, prefix, deep_merge(base, body)))
    names = [n for n, _, _ in stage_raws]
    for n in {n for n in names if names.count(n) > 1}:
        problems.append(Problem("stages", n, "stage names must be unique", "rename one of them"))

    stages = []
    for name, prefix, body in stage_raws:
        cfg = _validate_model(body, (prefix,) if prefix else (), problems)
        if cfg is None:
            continue
        cfg = resolve_paths(cfg.model_copy(update={"stages": []}), base_dir)
        problems.extend(check_semantics(cfg, prefix=str(prefix), check_files=check_files))
        stages.append(Stage(name, cfg))
    if problems:
        raise ConfigError(_dedupe(problems), source)
    return RunConfig(config=top, stages=tuple(stages), source=source)


def load_plugins(modules: list[str], base_dir: Path) -> list[Problem]:
    """Import the config's ``plugins`` (with the config's folder and the working directory on the import
    path, which ``module:attr`` names need too); one problem per module that fails to import."""
    from trivium.registry import UnknownPartError, add_import_paths, import_plugin

    add_import_paths(base_dir, Path.cwd())
    problems = []
    for i, module in enumerate(modules):
        try:
            import_plugin(module)
        except UnknownPartError as err:
            problems.append(Problem(join_path("plugins", i), module, err.rule, err.fix))
    return problems


def _validate_model(raw: dict[str, Any], prefix: tuple, problems: list[Problem]) -> TriviumConfig | None:
    try:
        return TriviumConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(_problem_from_pydantic(err, prefix))
        return None


def _problem_from_pydantic(err: dict[str, Any], prefix: tuple) -> Problem:
    loc = tuple(err["loc"])
    path = join_path(*prefix, *loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        hint = did_you_mean(str(loc[-1]), allowed)
        fix = (hint + " " if hint else "") + f"valid keys here: {', '.join(allowed)}"
        return Problem(path, err.get("input"), "unknown key", fix)
    if kind == "missing":
        return Problem(path, "<missing>", "this field is required", "add it")
    fixes = {
        "literal_error": "use one of the listed values",
        "enum": "use one of the listed values",
    }
    fix = fixes.get(kind) or _type_fix(kind)
    return Problem(path, err.get("input"), err["msg"], fix)


def _type_fix(kind: str) -> str:
    if kind.endswith("_parsing") or kind.endswith("_type"):
        wanted = kind.split("_")[0]
        return f"write a value of type {wanted}"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        return "choose a value within the allowed range"
    return ""


def _fields_at(loc: tuple) -> list[str]:
    """Field names of the model found by walking ``loc`` from TriviumConfig (for did-you-mean)."""
    model: Any = TriviumConfig
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return []
        model = _unwrap(model.model_fields[part].annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """The model class inside Optional[...] / list[...] annotations."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            inner = _unwrap(arg)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return annotation
