"""Checks of the data pipeline's fields (docs/data.md): selector, experience and task operators, the task
sets of ``buffer.tasksets``. Pure: problems are returned."""

from __future__ import annotations

from pathlib import Path

from trivium.config.errors import Problem
from trivium.config.schema import TriviumConfig
from trivium.config.schema_data import looks_like_hub_id
from trivium.registry import part_args

__all__ = ["check_data_pipeline", "extra_tasksets", "is_hub_path"]


def is_hub_path(path: str) -> bool:
    """A task set path that names a Hugging Face dataset id (kept relative by ``resolve_paths``)."""
    return bool(path) and not Path(path).is_absolute() and looks_like_hub_id(path, Path.cwd())


def extra_tasksets(cfg: TriviumConfig) -> list[tuple[str, object]]:
    """``(field, section)`` of the explored task sets beyond ``buffer.taskset`` (which is tasksets[0])."""
    if cfg.mode not in ("both", "explore"):
        return []
    return [(f"buffer.tasksets[{i}]", ts) for i, ts in enumerate(cfg.buffer.tasksets) if i > 0]


def check_data_pipeline(cfg: TriviumConfig, at) -> list[Problem]:
    from trivium.buffer.operators import EXPERIENCE_OPS
    from trivium.buffer.selectors import SELECTORS
    from trivium.buffer.sources import TASK_OPS

    b = cfg.buffer
    out: list[Problem] = []
    if b.selector is not None:
        problem = SELECTORS.problem(b.selector)
        if problem:
            out.append(Problem(at("buffer.selector"), b.selector, problem.rule, problem.fix))
        else:
            out += _unknown_args(
                at("buffer.selector_args"), SELECTORS.get(b.selector).__init__, b.selector_args, 2
            )
    elif b.selector_args:
        out.append(
            Problem(
                at("buffer.selector_args"),
                b.selector_args,
                "arguments without a selector",
                "set buffer.selector",
            )
        )
    for i, op in enumerate(b.experience_ops):
        problem = EXPERIENCE_OPS.problem(op.name)
        if problem:
            out.append(Problem(at(f"buffer.experience_ops[{i}].name"), op.name, problem.rule, problem.fix))
        else:
            field = at(f"buffer.experience_ops[{i}].args")
            unknown = _unknown_args(field, EXPERIENCE_OPS.get(op.name), op.args, 1)
            out += unknown
            if not unknown:
                try:  # the operator's own value checks
                    EXPERIENCE_OPS.check_args(op.name, op.args)
                except ValueError as exc:
                    out.append(Problem(field, op.args, str(exc), "fix the value"))
    sections = [("buffer.taskset", b.taskset)] + [
        (f"buffer.tasksets[{i}]", ts) for i, ts in enumerate(b.tasksets)
    ]
    sections += [(f"buffer.eval_tasksets[{i}]", ts) for i, ts in enumerate(b.eval_tasksets)]
    for field, ts in sections:
        for i, op in enumerate(getattr(ts, "task_ops", [])):
            problem = TASK_OPS.problem(op.name)
            if problem:
                out.append(Problem(at(f"{field}.task_ops[{i}].name"), op.name, problem.rule, problem.fix))
            else:
                out += _unknown_args(at(f"{field}.task_ops[{i}].args"), TASK_OPS.get(op.name), op.args, 1)
    if cfg.algorithm.overlong_penalty.enabled and "overlong_penalty" in [op.name for op in b.experience_ops]:
        out.append(
            Problem(
                at("algorithm.overlong_penalty.enabled"),
                True,
                "the overlong penalty would be applied twice (by the trainer and by buffer.experience_ops)",
                "keep one: the operator (explore side) or algorithm.overlong_penalty (trainer side, also for "
                "experiences that no explorer wrote, e.g. serve mode)",
            )
        )
    names = [ts.name or Path(ts.path).stem for ts in b.tasksets]
    if len(set(names)) != len(names):
        out.append(
            Problem(
                at("buffer.tasksets"),
                names,
                "task sets of one stage need distinct names (they prefix task ids)",
                "set a name on each entry",
            )
        )
    return out


def _unknown_args(field: str, fn, args: dict, skip: int) -> list[Problem]:
    """Keys of ``args`` that ``fn`` (after its first ``skip`` parameters) does not take."""
    valid = part_args(fn, skip)
    unknown = [] if valid is None else sorted(set(args) - set(valid))
    if not unknown:
        return []
    return [Problem(field, args, f"unknown argument(s) {unknown}", f"valid: {', '.join(valid) or 'none'}")]
