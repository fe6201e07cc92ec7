"""The inert-key scan: every config field acts or is refused (issue 25 item 5).

A field a user can set but no code reads is a promise the framework does not keep. This scan runs real,
short runs of every mode and algorithm family in this process with the schema's models traced (every
read of a field, by model class and field name) and then holds the schema against what was read:

- every field is read by at least one run, or is named in ``ELSEWHERE`` with the part that reads it
  where this scan cannot run it (a GPU, Ray, vLLM, an online tracker) and the test that covers it;
- in the offline algorithms' runs (SFT, DPO) every ``trainer.*`` and ``algorithm.*`` field that the run
  did not read is refused by ``check-config`` when set to a value other than its default, or is named in
  ``NOT_FOR`` with the reason it does not apply (a value the run reads elsewhere, e.g. only with
  packing on).

Both tables are checked for staleness too: a field named in ``ELSEWHERE`` that a run read, or in
``NOT_FOR`` that the run read or that check-config refuses, fails the scan, so the tables stay a true
record. A field added to the schema later fails the scan until a run reads it or it is refused.
"""

from __future__ import annotations

import contextlib
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel

from trivium.cli import main as cli
from trivium.config import ConfigError
from trivium.config.schema import TriviumConfig
from trivium.config.schema_base import StrictModel
from trivium.validation import load_config

# Fields this scan's CPU runs cannot reach, with the part that reads each and the test that covers it.
ELSEWHERE: dict[str, str] = {
    **{
        f"ClusterConfig.{f}": "the Ray launcher (launch/ray_*.py): tests/launch/test_ray_runs.py (slow)"
        for f in (
            "address",
            "namespace",
            "start_timeout_s",
            "max_restarts",
            "trainer_rank",
            "explorer",
            "engine",
            "checkpoint_files",
        )
    },
    **{
        f"ActorResources.{f}": "Ray actor options (launch/ray_cluster.py): tests/launch/test_ray_runs.py, "
        "tests/launch/test_ray_nodes.py"
        for f in ("num_cpus", "num_gpus", "memory_gb", "resources")
    },
    **{
        f"RolloutConfig.{f}": "the vLLM engine (models/vllm_engine.py): tests/models/test_vllm_engine.py, .ci/vllm"
        for f in ("vllm_enforce_eager", "vllm_gpu_memory_utilization", "vllm_kv_cache_gb")
    },
    "SynchronizerConfig.collective_backend": "synchronizer.method collective across processes: "
    "tests/launch/test_decoupled_processes.py",
    "SynchronizerConfig.collective_init": "as collective_backend",
    **{
        f"WandbConfig.{f}": "the wandb tracker (monitor/trackers.py): tests/monitor/test_trackers.py"
        for f in ("project", "entity", "mode", "tags")
    },
    **{
        f"MlflowConfig.{f}": "the MLflow tracker (monitor/trackers.py): tests/monitor/test_trackers.py"
        for f in ("tracking_uri", "experiment")
    },
    "TinyModelConfig.image_size": "the tiny vision-language model's image processor (model.tiny.architecture "
    "qwen2_vl; launch/build.py ensure_model): tests/config/test_vision_checks.py",
    "MonitorConfig.wandb": "as WandbConfig",
    "MonitorConfig.mlflow": "as MlflowConfig",
}


def schema_fields(cls: type[BaseModel] = TriviumConfig, prefix: str = "", out=None) -> dict[str, list[str]]:
    """``{"Class.field": [dotted paths]}`` of every field of the schema, nested models included."""
    out = {} if out is None else out
    for name, info in cls.model_fields.items():
        path = f"{prefix}{name}"
        out.setdefault(f"{cls.__name__}.{name}", []).append(path)
        for sub in _models_in(info.annotation):
            if f"{sub.__name__}." not in "".join(out):  # a model reused at several paths: walked once
                schema_fields(sub, path + ".", out)
            else:
                for key in [k for k in out if k.startswith(f"{sub.__name__}.")]:
                    out[key].append(f"{path}.{key.split('.', 1)[1]}")
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found, todo = [], [annotation]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            found.append(t)
        todo += typing.get_args(t)
    return found


@contextlib.contextmanager
def traced_reads():
    """Record ``"Class.field"`` for every read of a schema field through attribute access."""
    reads: set[str] = set()
    original = StrictModel.__getattribute__

    def traced(self, name):
        cls = type(self)
        if name in cls.__pydantic_fields__:
            reads.add(f"{cls.__name__}.{name}")
        return original(self, name)

    StrictModel.__getattribute__ = traced
    try:
        yield reads
    finally:
        StrictModel.__getattribute__ = original


def base(tmp: Path, model_dir: Path, name: str) -> dict[str, Any]:
    from tests.launch.helpers import tiny_run_config

    return tiny_run_config(tmp, model_dir, "inert", name)


def grpo_everything(tmp: Path, model_dir: Path, data: Path) -> dict[str, Any]:
    """Mode both with as many of the RL parts on at once as one run takes."""
    cfg = base(tmp, model_dir, "grpo")
    cfg["model"]["lora"] = {"rank": 4, "alpha": 8, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    cfg["explorer"] = {
        "rollout": {"max_tokens": 6, "temperature": 0.9, "top_p": 0.95},
        "eval_at_start": True,
        "eval_interval": 2,
        "eval": {"temperature": 0.5, "repeat_times": 2},
        # on, with more samples than the run has tasks: read, never binding (tests/explorer covers it)
        "dynamic_timeout": {"enable": True, "ratio": 50.0, "window": 16, "min_samples": 10_000},
    }
    cfg["algorithm"] = {
        "algorithm_type": "grpo",
        "kl_loss": {"coef": 0.01, "estimator": "k3"},
        "entropy_coef": 0.001,
        "rollout_is_cap": 2.0,
        "overlong_penalty": {"enabled": True, "cache_length": 2, "factor": 0.5},
    }
    cfg["trainer"] = {
        "lr": 1e-4,
        "betas": [0.9, 0.99],
        "weight_decay": 0.01,
        "grad_clip": 0.5,
        "lr_scheduler": "cosine",
        "warmup_steps": 1,
        "min_lr_ratio": 0.1,
        "ppo_epochs": 2,
        "mini_batch_size": 2,
        "micro_batch_size": 2,
        "max_tokens_per_micro_batch": 64,
        "skip_grad_norm": 1e5,
        "max_bad_steps": 2,
        "max_abs_reward": 100.0,
        "save_interval": 1,
        "keep_checkpoints": 1,
    }
    train, test = str(data / "train.jsonl"), str(data / "test.jsonl")
    cfg["buffer"] = {
        "batch_size": 2,
        "total_steps": 2,
        "tasksets": [
            {"path": train, "repeat_times": 2, "weight": 2.0, "max_rows": 32, "on_bad_row": "skip"},
            {
                "path": test,
                "name": "second",
                "repeat_times": 2,
                "shuffle": False,
                "task_ops": [{"name": "dedup", "args": {"fields": ["question"]}}],
            },
        ],
        "eval_tasksets": [{"path": test, "max_rows": 4}],
        "selector": "online_difficulty",
        "selector_args": {"target": 0.5},
        "experience_ops": [{"name": "reward_range", "args": {"min": -10, "max": 10}}],
        "storage": {
            "policy": "replay",
            "replay": {"version_weight": 1.0, "use_weight": 0.5, "cooldown_steps": 0, "max_uses": 2},
            "table": "inert",
            "read_timeout_s": 60,
        },
    }
    cfg["monitor"] = {
        "progress_bar": False,
        "backends": ["tensorboard"],
        "tensorboard": {"log_dir": str(tmp / "tb")},
        "trajectories": {"every": 1, "per_step": 2},
    }
    return cfg


def sft(tmp: Path, model_dir: Path, data: Path) -> dict[str, Any]:
    cfg = base(tmp, model_dir, "sft")
    cfg["mode"] = "train"
    cfg["algorithm"] = {"algorithm_type": "sft"}
    cfg["trainer"] = {"pack_length": 64, "micro_batch_size": 2, "save_interval": 1, "lr_scheduler": "linear"}
    cfg["buffer"] = {
        "batch_size": 4,
        "total_epochs": 1,
        "sft_dataset": {
            "path": str(data / "sft.jsonl"),
            "fields": {"prompt": "question", "response": "answer"},
            "system_prompt": "Answer.",
            "max_rows": 8,
            "shuffle": False,
            "on_bad_row": "skip",
        },
    }
    return cfg


def dpo(tmp: Path, model_dir: Path, data: Path) -> dict[str, Any]:
    import json

    pairs = tmp / "pairs.jsonl"
    rows = [json.loads(line) for line in (data / "sft.jsonl").read_text().splitlines()[:6]]
    pairs.write_text(
        "".join(json.dumps({"q": r["question"], "good": r["answer"], "bad": "no"}) + "\n" for r in rows)
    )
    cfg = base(tmp, model_dir, "dpo")
    cfg["mode"] = "train"
    cfg["algorithm"] = {"algorithm_type": "dpo", "dpo": {"beta": 0.2, "label_smoothing": 0.1}}
    cfg["trainer"] = {
        "micro_batch_size": 2,
        "lr_scheduler": "cosine",
        "min_lr_ratio": 0.1,
        "save_interval": 1,
    }
    cfg["buffer"] = {
        "batch_size": 2,
        "total_steps": 2,
        "preference_dataset": {
            "path": str(pairs),
            "fields": {"prompt": "q", "chosen": "good", "rejected": "bad"},
            "system_prompt": "Answer.",
            "max_rows": 4,
            "shuffle": False,
            "on_bad_row": "skip",
        },
    }
    return cfg


def rl(
    tmp: Path, model_dir: Path, data: Path, name: str, algorithm: dict[str, Any], **buffer
) -> dict[str, Any]:
    cfg = base(tmp, model_dir, name)
    cfg["algorithm"] = algorithm
    cfg["buffer"] = {
        "batch_size": 2,
        "total_steps": 1,
        "taskset": {"path": str(data / "train.jsonl"), "repeat_times": 2},
        **buffer,
    }
    return cfg


def ppo(tmp, model_dir, data):
    critic = {"lr": 1e-4, "value_clip": 0.2, "warmup_steps": 1, "gamma": 0.99, "lam": 0.95}
    kl = {"coef": 0.01, "adaptive": True, "target_kl": 0.1, "horizon": 100}
    return rl(tmp, model_dir, data, "ppo", {"algorithm_type": "ppo", "critic": critic, "kl_penalty": kl})


def distill(tmp, model_dir, data):
    cfg = rl(tmp, model_dir, data, "distill", {"algorithm_type": "on_policy_distill", "teacher": "big"})
    cfg["auxiliary_models"] = [{"name": "big", "path": str(model_dir), "dtype": "float32"}]
    return cfg


def chord(tmp, model_dir, data):
    expert = {"path": str(data / "sft.jsonl"), "fields": {"prompt": "question", "response": "answer"}}
    return rl(
        tmp,
        model_dir,
        data,
        "chord",
        {"algorithm_type": "mix_chord"},
        expert_dataset=expert,
        expert_per_step=1,
    )


def tiny_recipe(tmp, model_dir, data):
    """SFT of a model made from a recipe (model.tiny)."""
    cfg = sft(tmp, model_dir, data)
    cfg["name"] = "tiny"
    cfg["model"] = {
        "path": str(tmp / "recipe-model"),
        "tiny": {
            "corpus": [str(data / "train.jsonl")],
            "architecture": "qwen2",
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 64,
            "vocab_size": 300,
            "seed": 1,
        },
    }
    return cfg


def bench(tmp, model_dir, data):
    """Mode bench over the SFT run's checkpoints (RUNS runs it after that one) and the base model."""
    cfg = base(tmp, model_dir, "bench")
    cfg["mode"] = "bench"
    sft_run = tmp.parent / "sft0" / "runs" / "inert" / "sft" / "checkpoints"
    cfg["bench"] = {"checkpoints": "latest", "include_base": True, "checkpoint_dir": str(sft_run)}
    cfg["buffer"] = {"eval_tasksets": [{"path": str(data / "test.jsonl"), "max_rows": 2}]}
    return cfg


RUNS = {"grpo": grpo_everything, "sft": sft, "dpo": dpo, "ppo": ppo, "distill": distill, "chord": chord}
RUNS.update(tiny=tiny_recipe, bench=bench)


def serve_run(tmp: Path, model_dir: Path) -> None:
    """Mode serve in a thread: one call and its feedback, then stopped."""
    import json
    import urllib.request

    from tests.launch.helpers import serving

    from trivium.validation import validate_raw

    cfg = base(tmp, model_dir, "serve")
    cfg.update(mode="serve", synchronizer={"method": "checkpoint", "wait_timeout_s": 30})
    cfg["buffer"] = {"storage": {}}
    cfg["serve"] = {"port": 0, "keep_calls": 4, "max_n": 2, "max_tokens": 8, "model_name": "inert"}
    (stage,) = validate_raw(cfg, tmp).stages
    run_dir = tmp / "runs" / "inert" / "serve"
    run_dir.mkdir(parents=True)

    def post(url: str, body: dict) -> dict:
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    with serving(stage.config, run_dir) as info:
        messages = [{"role": "user", "content": "Tom has 2 apples and gets 3 more. How many now?"}]
        call = post(
            f"{info['base_url']}/chat/completions", {"model": "inert", "messages": messages, "max_tokens": 4}
        )
        post(info["feedback_url"], {"id": call["id"], "reward": 1.0})


@pytest.fixture(scope="module")
def reads(tmp_path_factory, tiny_model_dir, word_problem_dir) -> dict[str, set[str]]:
    """What each run read, by run name; the runs' configs are kept in ``reads.configs``."""
    out, configs = {}, {}
    for name, make in RUNS.items():
        tmp = tmp_path_factory.mktemp(name)
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(make(tmp, tiny_model_dir, word_problem_dir)))
        with traced_reads() as read:
            code = cli(["run", "-c", str(path)])
        assert code == 0, f"the {name} run of the scan failed"
        out[name], configs[name] = read, path
    with traced_reads() as read:
        serve_run(tmp_path_factory.mktemp("serve"), tiny_model_dir)
    out["serve"] = read
    out["configs"] = configs  # type: ignore[assignment]
    return out


def test_every_field_is_read_by_a_run_or_named_with_what_reads_it(reads):
    fields = schema_fields()
    every = set().union(*(v for k, v in reads.items() if k != "configs"))
    unread = sorted(k for k in fields if k not in every and k not in ELSEWHERE)
    assert not unread, (
        "fields no run of the scan read (each is accepted and then does nothing, or its reader is "
        "elsewhere: add a run that reads it, refuse it, or name its reader in ELSEWHERE): "
        + ", ".join(f"{k} ({fields[k][0]})" for k in unread)
    )
    stale = sorted(k for k in ELSEWHERE if k in every or k not in fields)
    assert not stale, f"ELSEWHERE names fields a run read or the schema no longer has: {stale}"


# The offline algorithms' runs against the trainer's and the algorithm's fields: what each run does not
# read and check-config does not refuse, with the reason it does not apply.
OTHER_ALGORITHMS = (
    "another algorithm's section; a multi-stage config sets it at the top level for the stage that uses "
    "it, so the other stages must accept it"
)
NOT_FOR: dict[str, dict[str, str]] = {
    "sft": {
        **{f"DpoConfig.{f}": OTHER_ALGORITHMS for f in ("beta", "label_smoothing")},
        **{
            f"CriticConfig.{f}": OTHER_ALGORITHMS
            for f in ("lr", "value_clip", "warmup_steps", "gamma", "lam")
        },
        **{f"KLPenaltyConfig.{f}": OTHER_ALGORITHMS for f in ("adaptive", "target_kl", "horizon")},
        "AlgorithmConfig.teacher": OTHER_ALGORITHMS,
    },
    "dpo": {
        **{
            f"CriticConfig.{f}": OTHER_ALGORITHMS
            for f in ("lr", "value_clip", "warmup_steps", "gamma", "lam")
        },
        **{
            f"KLPenaltyConfig.{f}": OTHER_ALGORITHMS
            for f in ("adaptive", "target_kl", "horizon", "estimator")
        },
        "KLLossConfig.estimator": "read only with kl_loss.coef > 0, which DPO refuses",
        "AlgorithmConfig.teacher": OTHER_ALGORITHMS,
    },
}


def other_value(cls: type[BaseModel], name: str) -> Any:
    """A valid value of a scalar field other than its default, or None when the field is not scalar."""
    info = cls.model_fields[name]
    default = info.get_default(call_default_factory=True)
    annotation = info.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return next(v for v in typing.get_args(annotation) if v != default)
    kind = annotation if isinstance(annotation, type) else (args[0] if len(args) == 1 else None)
    if kind is bool or bool in args:  # a switch, or one with a mode besides (true | false | "auto")
        return default is not True
    if kind not in (int, float):
        return None
    for value in ((default or 0) + 1, (default or 0) * 2, 1, 0.5, 0.1, 2):
        value = kind(value)
        if value == default:
            continue
        try:
            cls(**{name: value})
        except ValueError:
            continue
        return value
    return None


@pytest.mark.parametrize("run", ["sft", "dpo"])
def test_an_offline_algorithm_reads_or_refuses_every_trainer_and_algorithm_field(reads, run):
    fields = schema_fields()
    owned = {k: paths for k, paths in fields.items() if paths[0].split(".")[0] in ("trainer", "algorithm")}
    not_for = NOT_FOR[run]
    silent, stale = [], []
    for key, paths in sorted(owned.items()):
        cls_name, name = key.split(".")
        cls = next(c for c in _all_models() if c.__name__ == cls_name)
        value = other_value(cls, name)
        path = next(p for p in paths if p.split(".")[0] in ("trainer", "algorithm"))
        refused = value is not None and _refused(reads["configs"][run], path, value)
        if key in not_for:
            if key in reads[run] or refused:
                stale.append(key)
            continue
        if key in reads[run] or refused or _models_in(cls.model_fields[name].annotation):
            continue
        silent.append(f"{path} (set to {value!r})" if value is not None else f"{path} (not a scalar)")
    assert not silent, f"the {run} run neither reads nor refuses: {silent}"
    assert not stale, f"NOT_FOR[{run!r}] names fields the run reads or check-config refuses: {stale}"


def _all_models() -> list[type[BaseModel]]:
    found, todo = [], [TriviumConfig]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo += [m for info in cls.model_fields.values() for m in _models_in(info.annotation)]
    return found


def _refused(config: Path, path: str, value: Any) -> bool:
    """Whether check-config refuses ``path`` set to ``value``, naming it. A field of a section with an
    ``enabled`` switch is set with the switch on (a setting of a section that is off is read when it is
    turned on): refusing the switch refuses the field."""
    overrides = [f"{path}={yaml.safe_dump(value).splitlines()[0]}"]
    parent, _, name = path.rpartition(".")
    cls = next((c for c in _all_models() if name in c.model_fields and "enabled" in c.model_fields), None)
    if (
        cls is not None
        and name != "enabled"
        and f"{parent}.enabled" in {p for ps in schema_fields().values() for p in ps}
    ):
        overrides.append(f"{parent}.enabled=true")
    try:
        load_config(config, overrides)
    except ConfigError as error:
        return path in str(error) or (len(overrides) > 1 and f"{parent}.enabled" in str(error))
    return False
