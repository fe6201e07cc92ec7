"""Checks of a stage's data against its mode and algorithm (docs/data.md): what each mode reads and
writes, the algorithm's offline data, teacher and sample strategy, every task set (file, workflow, fields,
reward) and dataset, and the batch arithmetic. Pure: problems are returned."""

from __future__ import annotations

from pathlib import Path

from trivium.config.errors import Problem, did_you_mean
from trivium.config.schema import TaskSetConfig, TriviumConfig
from trivium.validation.validate_data import extra_tasksets, is_hub_path
from trivium.validation.validate_layout import preset_or_none

__all__ = ["check_stage_data"]


def check_stage_data(cfg: TriviumConfig, at, check_files: bool) -> list[Problem]:
    """Every data problem of a stage (``at`` turns a field path into the stage's)."""
    return [
        *_mode_problems(cfg, at),
        *_algorithm_data_problems(cfg, at),
        *_file_problems(cfg, at, check_files),
        *_batch_problems(cfg, at),
    ]


def _mode_problems(cfg: TriviumConfig, at) -> list[Problem]:
    """What the stage's mode reads and writes: a persistent buffer, a task set, a step count."""
    out = []
    buf = cfg.buffer
    if cfg.mode == "explore" and buf.storage is None:
        out.append(
            Problem(
                at("buffer.storage"),
                None,
                "mode 'explore' writes experiences to a persistent buffer",
                "set buffer.storage (e.g. {} for a SQLite file in the run folder)",
            )
        )
    if cfg.mode == "both" and cfg.synchronizer.method != "memory":
        fix = (
            "or start two processes of this config, one with --set mode=explore and one with --set mode=train"
        )
        if at("mode") != "mode":  # a stage: its own mode wins over the top level's (validation/load.py)
            fix = "or run this stage as two processes (mode explore and mode train) from a config of its own"
        out.append(
            Problem(
                at("synchronizer.method"),
                cfg.synchronizer.method,
                "explorer and trainer share one process in mode 'both': weights move in memory",
                f"use method: memory; {fix} (examples/decoupled/)",
            )
        )
    if cfg.mode in ("explore", "train") and buf.storage is not None and cfg.synchronizer.sync_offset:
        out.append(
            Problem(
                at("synchronizer.sync_offset"),
                cfg.synchronizer.sync_offset,
                "separate processes pace themselves by weight versions; sync_offset is not used",
                "remove it (use sync_interval)",
            )
        )
    if cfg.mode == "train" and buf.storage is not None and buf.taskset is None and not buf.total_steps:
        out.append(
            Problem(
                at("buffer.total_steps"),
                None,
                "a train process reading the buffer without a task set (e.g. fed by serve mode) trains "
                "buffer.batch_size experiences a step and needs to know how many steps",
                "set buffer.total_steps, or use the explore process's config (with buffer.taskset)",
            )
        )
    if cfg.mode in ("both", "explore") and buf.taskset is None:
        out.append(
            Problem(at("buffer.taskset"), None, "mode 'both' explores tasks", "set buffer.taskset.path")
        )
    return out


def _algorithm_data_problems(cfg: TriviumConfig, at) -> list[Problem]:
    """The algorithm's offline dataset, teacher and sample strategy; bench's eval task sets."""
    out = []
    buf = cfg.buffer
    preset = preset_or_none(cfg)
    wanted = preset.offline_data if preset is not None else None
    for kind, field in (("sft", "sft_dataset"), ("preference", "preference_dataset")):
        if cfg.mode == "train" and wanted == kind and getattr(buf, field) is None:
            out.append(
                Problem(
                    at(f"buffer.{field}"),
                    None,
                    f"algorithm '{preset.name}' in mode 'train' reads buffer.{field}",
                    f"set buffer.{field}.path",
                )
            )
    if preset is not None and preset.needs_teacher:
        names = [aux.name for aux in cfg.auxiliary_models]
        if cfg.algorithm.teacher not in names:
            out.append(
                Problem(
                    at("algorithm.teacher"),
                    cfg.algorithm.teacher,
                    f"algorithm '{preset.name}' needs a teacher among auxiliary_models {names}",
                    "add auxiliary_models: [{name: teacher, path: <model folder>}]",
                )
            )
    if preset is not None:
        from trivium.buffer.sampling import SAMPLE_STRATEGIES, problems_of

        name = cfg.algorithm.sample_strategy or preset.sample_strategy
        problem = SAMPLE_STRATEGIES.problem(name)
        if problem:
            out.append(Problem(at("algorithm.sample_strategy"), name, problem.rule, problem.fix))
        else:
            strategy = SAMPLE_STRATEGIES.get(name)
            for path, rule, fix in problems_of(strategy, cfg, cfg.algorithm.sample_strategy_args):
                out.append(Problem(at(path), None, rule, fix))
    out += _state_problems(cfg, at)
    out += _retry_problems(cfg, at)
    if cfg.mode == "bench" and not buf.eval_tasksets:
        out.append(
            Problem(
                at("buffer.eval_tasksets"),
                [],
                "mode 'bench' evaluates on eval task sets",
                "list at least one under buffer.eval_tasksets",
            )
        )
    return out


def _state_problems(cfg: TriviumConfig, at) -> list[Problem]:
    """An advantage that groups turns by environment state needs a workflow that records the states."""
    from trivium.workflows.registry import WORKFLOWS

    preset = preset_or_none(cfg)
    advantage = cfg.algorithm.advantage_fn or (preset.advantage_fn if preset is not None else None)
    ts = cfg.buffer.taskset
    if advantage != "gigpo" or ts is None or WORKFLOWS.problem(ts.workflow):
        return []
    if WORKFLOWS.get(ts.workflow).records_states:
        return []
    return [
        Problem(
            at("buffer.taskset.workflow"),
            ts.workflow,
            "the gigpo advantage groups model turns by the environment state they started from, and workflow "
            f"'{ts.workflow}' records no states (one experience per episode or per call)",
            "use workflow: step_wise (one experience per turn, each with its state), or algorithm_type: grpo",
        )
    ]


def _retry_problems(cfg: TriviumConfig, at) -> list[Problem]:
    """reflect_retry retries what the environment diagnoses: an environment without ``diagnose`` retries nothing."""
    from trivium.envs.base import Environment
    from trivium.workflows.reflect_retry import ReflectRetryWorkflow
    from trivium.workflows.registry import WORKFLOWS

    ts = cfg.buffer.taskset
    if ts is None or WORKFLOWS.problem(ts.workflow):
        return []
    cls = WORKFLOWS.get(ts.workflow)
    if not (isinstance(cls, type) and issubclass(cls, ReflectRetryWorkflow)):
        return []
    try:
        env_class = cls(**ts.workflow_args).env_class
    except Exception:  # bad workflow_args: the workflow check names them
        return []
    if env_class.diagnose is not Environment.diagnose:
        return []
    return [
        Problem(
            at("buffer.taskset.workflow_args.env"),
            env_class.__name__,
            f"workflow '{ts.workflow}' retries failed episodes from the mistake the environment's diagnose() "
            f"names, and {env_class.__name__} has no diagnose(): no episode would be retried",
            "implement diagnose(actions) -> Diagnosis on the environment (trivium.envs.base), or use workflow: "
            "step_wise",
        )
    ]


def _file_problems(cfg: TriviumConfig, at, check_files: bool) -> list[Problem]:
    """Every task set and the SFT dataset: a file that is there, their parts and field names."""
    out = []
    buf = cfg.buffer
    tasksets: list[tuple[str, TaskSetConfig]] = []
    if buf.taskset is not None and cfg.mode in ("both", "explore"):
        tasksets.append(("buffer.taskset", buf.taskset))
    tasksets += extra_tasksets(cfg)
    tasksets += [(f"buffer.eval_tasksets[{i}]", ts) for i, ts in enumerate(buf.eval_tasksets)]
    for i, ts in enumerate(buf.eval_tasksets):
        out += _eval_taskset_problems(f"buffer.eval_tasksets[{i}]", ts, at)
    for path, ts in tasksets:
        if not ts.path:
            out.append(Problem(at(path + ".path"), ts.path, "a task set needs a file", "set its path"))
        elif check_files and not Path(ts.path).exists() and not is_hub_path(ts.path):
            out.append(Problem(at(path + ".path"), ts.path, "file not found", "check the path"))
        out += _check_taskset_parts(path, ts, at)
    if buf.sft_dataset is not None and cfg.mode == "train" and buf.sft_dataset.format == "prompt_response":
        sd = buf.sft_dataset
        if not sd.path:
            out.append(
                Problem(at("buffer.sft_dataset.path"), sd.path, "a dataset needs a file", "set its path")
            )
        elif check_files and not Path(sd.path).exists() and not is_hub_path(sd.path):
            out.append(Problem(at("buffer.sft_dataset.path"), sd.path, "file not found", "check the path"))
        for key in sd.fields:
            if key not in ("prompt", "response"):
                out.append(
                    Problem(
                        at(f"buffer.sft_dataset.fields.{key}"),
                        sd.fields[key],
                        "unknown field",
                        "map 'prompt' and 'response' to your columns",
                    )
                )
    return out


def _batch_problems(cfg: TriviumConfig, at) -> list[Problem]:
    """The train batch's arithmetic: mini-batches divide it."""
    out = []
    buf = cfg.buffer
    if cfg.mode == "both" and buf.taskset is not None:
        batch = buf.batch_size * buf.taskset.repeat_times
        mini = cfg.trainer.mini_batch_size
        if mini and batch % mini:
            out.append(
                Problem(
                    at("trainer.mini_batch_size"),
                    mini,
                    f"must divide the train batch (batch_size × repeat_times = {batch})",
                    "pick a divisor, or 0 for one update per batch",
                )
            )
    return out


def _check_taskset_parts(path: str, ts: TaskSetConfig, at) -> list[Problem]:
    """The task set's workflow (its arguments and environment included), field names and reward."""
    from trivium.registry import UnknownPartError
    from trivium.rewards.registry import REWARD_FNS, check_reward_args, reward_task_fields
    from trivium.workflows.registry import WORKFLOWS

    out = []
    problem = REWARD_FNS.problem(ts.reward_fn)
    if problem:
        out.append(Problem(at(path + ".reward_fn"), ts.reward_fn, problem.rule, problem.fix))
    else:
        try:
            check_reward_args(ts.reward_fn, ts.reward_args)
        except (TypeError, ValueError) as exc:
            fix = f"see the '{ts.reward_fn}' reward in docs/rewards.md for its arguments"
            out.append(Problem(at(path + ".reward_args"), ts.reward_args, str(exc), fix))
    problem = WORKFLOWS.problem(ts.workflow)
    if problem:
        return [*out, Problem(at(path + ".workflow"), ts.workflow, problem.rule, problem.fix)]
    workflow = WORKFLOWS.get(ts.workflow)
    try:  # constructors only check and store their arguments (an environment too): cheap, no model
        instance = workflow(**ts.workflow_args)
        if hasattr(instance, "make_env"):
            instance.make_env()
    except (TypeError, ValueError, UnknownPartError) as exc:
        out.append(
            Problem(
                at(path + ".workflow_args"),
                ts.workflow_args,
                str(exc),
                f"see the '{ts.workflow}' workflow's docstring for its arguments",
            )
        )
    known = [*workflow.fields, *reward_task_fields(ts.reward_fn)]  # the reward's own fields too (rubric)
    for key in ts.fields:
        if key not in known:
            hint = did_you_mean(key, known)
            out.append(
                Problem(
                    at(f"{path}.fields.{key}"),
                    ts.fields[key],
                    f"workflow '{ts.workflow}' (with reward '{ts.reward_fn}') has no field '{key}'",
                    (hint + " " if hint else "") + f"its fields: {', '.join(known)}",
                )
            )
    return out


# fields of a task set that mean nothing for evaluation, and what decides instead
_EVAL_IGNORES = {
    "repeat_times": (
        "evaluation samples each task explorer.eval.repeat_times times",
        "set explorer.eval.repeat_times",
    ),
    "weight": ("every eval task set is evaluated whole; weight mixes training task sets", "remove it"),
    "shuffle": (
        "evaluation reads every row once, in file order",
        "remove it (max_rows takes the first N rows)",
    ),
}


def _eval_taskset_problems(path: str, ts: TaskSetConfig, at) -> list[Problem]:
    """An eval task set's fields that evaluation does not read are refused, not silently ignored (when set to
    other than their default: stages see every field filled in)."""
    return [
        Problem(at(f"{path}.{name}"), getattr(ts, name), rule, fix)
        for name, (rule, fix) in _EVAL_IGNORES.items()
        if getattr(ts, name) != TaskSetConfig.model_fields[name].default
    ]
