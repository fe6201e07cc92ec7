"""Load a YAML config, apply ``--set`` overrides, expand stages, and validate everything at once.

Pure but for one thing: reading the YAML file (and the data files it names, to check them) is the only
I/O, and the modules listed under ``plugins`` are imported (they register the parts the config names);
nothing is created, downloaded or started here.

Design decisions (a config may come from anywhere; every bad one is a ``ConfigError``, never a traceback):
- The file is read by ``safe_yaml.load_yaml``: size, encoding, nesting and alias bombs are checked there.
- A ``--set`` value is parsed with the same bounded loader; text that YAML cannot read is refused with a
  hint to quote it, except a leading ``@`` or backtick (reserved by YAML, never meant as YAML): that is
  a string.
- Paths no file system accepts are refused before anything resolves them (``input_checks.check_paths``).
- A check that crashes on a value (a bug in a check, or a part reference it cannot import) becomes a
  problem naming the stage and the exception, so ``check-config`` still lists everything else.
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
from trivium.config.safe_yaml import MAX_DEPTH, load_yaml, safe_yaml, shown
from trivium.config.schema import TriviumConfig

# Top-level keys that a stage may not change: they name the run folder shared by all stages.
RUN_LEVEL_KEYS = ("project", "name", "checkpoint_root", "stages", "plugins", "runtime", "cluster")


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
    """YAML value, with numbers YAML 1.1 reads as strings (``1e-5``) turned into floats. Text starting with
    ``@`` or a backtick (characters YAML reserves) is a string: ``--set model.path=@org/model``."""
    if text.lstrip().startswith(("@", "`")):
        return text.strip()
    value = safe_yaml(text)
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
    from trivium.config.input_checks import check_paths
    from trivium.config.validate import resolve_paths

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
        unusable = check_paths(cfg, prefix=str(prefix))
        if unusable:  # a path no file system accepts: resolving or checking it would raise
            problems.extend(unusable)
            continue
        cfg = resolve_paths(cfg.model_copy(update={"stages": []}), base_dir)
        problems.extend(_checked(cfg, str(prefix), check_files))
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


def _checked(cfg: TriviumConfig, prefix: str, check_files: bool) -> list[Problem]:
    """``check_semantics``, with a crash of a check turned into a problem (see the module docstring)."""
    from trivium.config.input_checks import check_values
    from trivium.config.validate import check_semantics

    try:
        return check_values(cfg, prefix) + check_semantics(cfg, prefix=prefix, check_files=check_files)
    except Exception as exc:
        return [
            Problem(
                prefix,
                None,
                f"a check of this config crashed on one of its values: {type(exc).__name__}: {shown(str(exc))}",
                "look for a malformed value (e.g. a 'module:function' reference); please also report the crash",
            )
        ]


def _validate_model(raw: dict[str, Any], prefix: tuple, problems: list[Problem]) -> TriviumConfig | None:
    try:
        return TriviumConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(_problem_from_pydantic(err, prefix))
        return None


def _problem_from_pydantic(err: dict[str, Any], prefix: tuple) -> Problem:
    loc = tuple(err["loc"])
    # An empty or non-text key (``"": 1``, ``null: 1``) would vanish from the path: quote it.
    path = join_path(
        *prefix, *(p if isinstance(p, int) or (isinstance(p, str) and p) else repr(p) for p in loc)
    )
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
        "finite_number": "write a finite number (.inf and .nan are not allowed)",
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
