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
- Schema problems do not hide the rest: the fields that break the schema are reported, then dropped (their
  defaults apply) and the config validated again, so the checks across fields (``validate.py``) run on
  everything else and one report holds both kinds (``_validate_model``). Their problems at a dropped
  field are left out; the report's header names the dropped fields, since a check may have used a default.
- Stage modes: the top-level ``mode`` is the default of the stages that set none; a stage's own ``mode``
  wins. ``--set mode=X`` on a config whose stages set their own is refused, naming each stage and the
  ``--set stages.N.mode=X`` that reaches it; a decoupled process (mode explore or serve, or train reading
  ``buffer.storage``) runs a config of one stage (``_stage_mode_problems``).
"""

from __future__ import annotations

import copy
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trivium.config.errors import ConfigError, Problem, did_you_mean, join_path
from trivium.config.overrides import apply_overrides, deep_merge
from trivium.config.safe_yaml import load_yaml, shown
from trivium.config.schema import TriviumConfig

# Top-level keys that a stage may not change: they name the run folder shared by all stages.
RUN_LEVEL_KEYS = ("project", "name", "checkpoint_root", "stages", "plugins", "runtime", "cluster")
# monitor's tracker fields: one set of tracker runs for the whole run (monitor/tracker_set.py)
RUN_LEVEL_MONITOR_KEYS = frozenset(
    {"backends", "tensorboard", "wandb", "mlflow", "backend_args", "phase_memory"}
)
# Rounds of dropping the fields that break the schema (each round drops at least one; configs need 1-2).
MAX_REPAIRS = 8
# A schema problem under these keys stops validation there: stages and plugins shape everything after them.
NO_REPAIR_KEYS = ("stages", "plugins")


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


def _dedupe(problems: list[Problem]) -> list[Problem]:
    """Drop repeats of one problem that every stage inherits from the top level (same field, same value)."""
    seen, out = set(), []
    for p in problems:
        key = (p.path.split("].", 1)[-1] if p.path.startswith("stages[") else p.path, repr(p.value), p.rule)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def load_config(
    path: str | Path,
    overrides: list[str] | None = None,
    check_files: bool = True,
    *,
    read_data: bool = False,
    given_as: str = "the path after --config",
) -> RunConfig:
    """Load, override, expand stages and validate. Raises one ``ConfigError`` listing every problem.

    ``read_data``: read every data file's rows too (``trivium check-config``); ``given_as``: where the user
    typed the path, for the message when no file is there (e.g. "the path after --config").
    """
    _check_config_file(path, given_as)
    overrides = overrides or []
    raw = apply_overrides(load_yaml(path), overrides)
    mode_set = any(item.partition("=")[0].strip() == "mode" for item in overrides)
    return validate_raw(
        raw,
        base_dir=Path(path).resolve().parent,
        source=str(path),
        check_files=check_files,
        read_data=read_data,
        mode_set=mode_set,
    )


def _check_config_file(path: str | Path, given_as: str) -> None:
    """A missing config file or a folder, named with where the user gave it (``load_yaml`` checks the
    rest)."""
    where = shown(str(path))
    try:
        folder = os.path.isdir(path)
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        fix = f"check {given_as}" + ("" if Path(path).suffix else " (a config is a .yaml file)")
        raise ConfigError([Problem("", where, "config file not found", fix)], where) from None
    except (OSError, ValueError):
        return  # a path no file system accepts: load_yaml names why
    if folder:
        fix = f"make {given_as} the YAML file, not its folder"
        raise ConfigError([Problem("", where, "this is a folder, not a config file", fix)], where)


def validate_raw(
    raw: dict[str, Any],
    base_dir: Path,
    source: str = "config",
    check_files: bool = True,
    *,
    read_data: bool = False,
    mode_set: bool = False,
) -> RunConfig:
    """Validate a loaded config (``mode_set``: ``mode`` came from ``--set``, for the stage-mode check)."""
    from trivium.validation.input_checks import check_data_files

    problems: list[Problem] = []
    dropped: list[str] = []  # fields that broke the schema and were checked at their defaults
    top = _validate_model(raw, (), problems, dropped)
    if top is None:
        raise ConfigError(problems, source)
    built = _build_stages(raw, top, base_dir, check_files, problems, dropped)
    problems[:0] = _stage_mode_problems(raw, top, built, mode_set)  # first: they explain others
    if read_data:  # a file with a problem already (e.g. not found) is not read again
        known = {p.path for p in problems}
        for _, prefix, stage in built:
            problems += [p for p in check_data_files(stage.config, prefix) if p.path not in known]
    if problems:
        raise ConfigError(_dedupe(problems), source, note=_dropped_note(dropped))
    return RunConfig(config=top, stages=tuple(s for _, _, s in built), source=source)


def _build_stages(
    raw: dict[str, Any],
    top: TriviumConfig,
    base_dir: Path,
    check_files: bool,
    problems: list[Problem],
    dropped: list[str],
) -> list[tuple[int, str, Stage]]:
    """Every stage's complete config (index, path prefix, stage); their problems go to ``problems``."""
    from trivium.validation.input_checks import check_paths
    from trivium.validation.validate import resolve_paths

    problems += load_plugins(top.plugins, base_dir, probe=True)  # a run, check-config, Studio
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
        monitor = stage.get("monitor")
        for k in sorted(set(monitor or {}) & RUN_LEVEL_MONITOR_KEYS if isinstance(monitor, dict) else ()):
            problems.append(
                Problem(
                    f"{prefix}.monitor.{k}",
                    monitor[k],
                    "the trackers are the run's",
                    "set it at the top level",
                )
            )
        body = {k: v for k, v in stage.items() if k != "name" and k not in RUN_LEVEL_KEYS}
        base = {k: v for k, v in raw.items() if k != "stages"}
        stage_raws.append((name, prefix, deep_merge(base, body)))
    names = [n for n, _, _ in stage_raws]
    for n in {n for n in names if names.count(n) > 1}:
        problems.append(Problem("stages", n, "stage names must be unique", "rename one of them"))

    built = []
    for i, (name, prefix, body) in enumerate(stage_raws):
        stage_dropped: list[str] = []
        cfg = _validate_model(body, (prefix,) if prefix else (), problems, stage_dropped)
        dropped += stage_dropped
        if cfg is None:
            continue
        unusable = check_paths(cfg, prefix=str(prefix))
        if unusable:  # a path no file system accepts: resolving or checking it would raise
            problems.extend(unusable)
            continue
        cfg = resolve_paths(cfg.model_copy(update={"stages": []}), base_dir)
        problems.extend(
            p for p in _checked(cfg, str(prefix), check_files) if not _related(p.path, stage_dropped)
        )
        built.append((i, str(prefix), Stage(name, cfg)))
    return built


def _stage_mode_problems(
    raw: dict[str, Any], top: TriviumConfig, built: list[tuple[int, str, Stage]], mode_set: bool
) -> list[Problem]:
    """A stage's own ``mode`` wins over the top-level one. Refused: ``--set mode=X`` that some stages
    ignore (each named, with the ``--set`` that reaches it), and a decoupled process among several stages
    (both processes would run every other stage too)."""
    several = len(top.stages) > 1
    alone = (
        "run that stage alone, from a config of its own whose model.path is the previous stage's final "
        "checkpoint (as examples/decoupled/grpo.yaml does for the quickstart's grpo stage)"
    )
    out = []
    if mode_set and top.stages:
        wanted = raw.get("mode")
        for i, stage in enumerate(top.stages):
            own = stage.get("mode")
            if "mode" not in stage or own == wanted:
                continue
            fix = f"--set stages.{i}.mode={wanted} changes this stage's mode"
            if several and wanted in DECOUPLED_MODES:
                fix = f"a decoupled run (mode explore + mode train) is one stage in two processes: {alone}"
            out.append(
                Problem(
                    f"stages[{i}].mode",
                    own,
                    f"stage '{stage.get('name')}' sets its own mode, which wins over the top-level mode "
                    f"that --set mode={wanted} changes (the top level is the default of stages that set none)",
                    fix,
                )
            )
    if out or not several:
        return out
    top_buffer = raw.get("buffer")
    shared_storage = isinstance(top_buffer, dict) and "storage" in top_buffer
    for _, prefix, stage in built:
        if not is_decoupled(stage.config):
            continue
        how = f"mode {stage.config.mode}"
        if stage.config.mode == "train":
            how += " reading buffer.storage" + (", which the top level sets for every stage" * shared_storage)
        out.append(
            Problem(
                f"{prefix}.mode",
                stage.config.mode,
                f"stage '{stage.name}' is one process of a decoupled run ({how}), but the config has other "
                "stages, which each process would run too",
                alone,
            )
        )
    return out


DECOUPLED_MODES = ("explore", "train", "serve")


def is_decoupled(cfg: TriviumConfig) -> bool:
    """Whether a stage is one process of a decoupled run: it shares its run folder with another process."""
    return cfg.mode in ("explore", "serve") or (cfg.mode == "train" and cfg.buffer.storage is not None)


def load_plugins(modules: list[str], base_dir: Path, probe: bool = False) -> list[Problem]:
    """Import the config's ``plugins`` (with the config's folder and the working directory on the import
    path, which ``module:attr`` names need too); one problem per module that fails to import. ``probe``:
    first import each new module in a child process (``registry.import_plugin``)."""
    from trivium.registry import UnknownPartError, add_import_paths, import_plugin

    add_import_paths(base_dir, Path.cwd())
    problems = []
    for i, module in enumerate(modules):
        try:
            import_plugin(module, probe=probe)
        except UnknownPartError as err:
            problems.append(Problem(join_path("plugins", i), module, err.rule, err.fix))
    return problems


def _checked(cfg: TriviumConfig, prefix: str, check_files: bool) -> list[Problem]:
    """``check_semantics``, with a crash of a check turned into a problem (see the module docstring)."""
    from trivium.validation.input_checks import check_values
    from trivium.validation.validate import check_semantics

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


def _validate_model(
    raw: dict[str, Any], prefix: tuple, problems: list[Problem], dropped: list[str]
) -> TriviumConfig | None:
    """``raw`` as a ``TriviumConfig``. Schema problems go to ``problems``; then the fields at fault are
    dropped (their defaults apply; a field inside a list drops the list) and the rest is validated again,
    so that the checks across fields can run on everything else. ``dropped`` receives the dropped paths.
    None when the config cannot be repaired (its stages or plugins are malformed, or nothing is left to
    drop). Problems of a later round at a dropped field (e.g. 'missing') are artefacts and left out."""
    raw = copy.deepcopy(raw)
    for attempt in range(MAX_REPAIRS):
        try:
            return TriviumConfig.model_validate(raw)
        except ValidationError as exc:
            errors = exc.errors()
        locs = []
        for err in errors:
            loc = tuple(err["loc"])
            path = _loc_path(prefix, loc)
            if attempt == 0 or (err["type"] != "missing" and not _related(path, dropped)):
                problems.append(_problem_from_pydantic(err, prefix))
            locs.append(_repair_target(loc, missing=err["type"] == "missing"))
        if any(not loc or str(loc[0]) in NO_REPAIR_KEYS for loc in locs):
            return None
        removed = [loc for loc in set(locs) if _drop(raw, loc)]
        if not removed:
            return None
        dropped += [_loc_path(prefix, loc) for loc in removed]
    return None


def _repair_target(loc: tuple, missing: bool) -> tuple:
    """What to drop for an error at ``loc``: the field; for a missing field its parent; for anything inside
    a list the whole list (dropping one item would shift the positions the other problems name)."""
    if missing:
        loc = loc[:-1]
    for i, part in enumerate(loc):
        if isinstance(part, int):
            return loc[:i]
    return loc


def _drop(raw: dict[str, Any], loc: tuple) -> bool:
    """Delete the key at ``loc`` (the deepest one that exists on its way: pydantic's locations may name a
    union member that the YAML does not have); whether something was deleted."""
    node: Any = raw
    for depth, part in enumerate(loc):
        if not isinstance(node, dict) or part not in node:
            return False
        if depth == len(loc) - 1 or not isinstance(node[part], dict) or loc[depth + 1] not in node[part]:
            del node[part]
            return True
        node = node[part]
    return False


def _loc_path(prefix: tuple, loc: tuple) -> str:
    # An empty or non-text key (``"": 1``, ``null: 1``) would vanish from the path: quote it.
    return join_path(
        *prefix, *(p if isinstance(p, int) or (isinstance(p, str) and p) else repr(p) for p in loc)
    )


def _related(path: str, dropped: list[str]) -> bool:
    """Whether ``path`` is one of the ``dropped`` fields, inside one, or contains one."""

    def inside(a: str, b: str) -> bool:
        return a == b or a.startswith((b + ".", b + "["))

    return any(inside(path, d) or inside(d, path) for d in dropped)


def _dropped_note(dropped: list[str]) -> str:
    if not dropped:
        return ""
    return "the checks across fields ran with the fields that break the schema at their defaults"


def _problem_from_pydantic(err: dict[str, Any], prefix: tuple) -> Problem:
    loc = tuple(err["loc"])
    path = _loc_path(prefix, loc)
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
