"""Turn a validated stage config into live components: model, tokenizer, engine, readers, explorer, trainer.

The only place that knows how components are wired; every component receives its collaborators.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
from pathlib import Path

import torch

from trivium.config.schema import TaskSetConfig, TinyModelConfig, TriviumConfig
from trivium.models.protocol import SamplingParams

log = logging.getLogger(__name__)


def ensure_model(cfg: TriviumConfig, run_dir: Path) -> str:
    """The model folder to load; creates the tiny model first when ``model.tiny`` asks for it."""
    path = cfg.model.path or str(run_dir / "base_model")
    if cfg.model.tiny is not None and not Path(path).exists():
        from trivium.models.tiny import make_tiny

        log.info("creating tiny model at %s", path)
        kwargs = tiny_kwargs(cfg.model.tiny)
        if kwargs.pop("architecture") == "qwen2_vl":
            from trivium.models.tiny_vlm import make_tiny_vlm

            side = cfg.model.tiny.image_size
            make_tiny_vlm(path, corpus_lines(cfg.model.tiny), max_pixels=side * side, **kwargs)
        else:
            make_tiny(path, corpus_lines(cfg.model.tiny), architecture=cfg.model.tiny.architecture, **kwargs)
    return path


def tiny_kwargs(t: TinyModelConfig) -> dict:
    return {
        "vocab_size": t.vocab_size,
        "hidden_size": t.hidden_size,
        "num_layers": t.num_layers,
        "num_heads": t.num_heads,
        "num_kv_heads": t.num_kv_heads,
        "intermediate_size": t.intermediate_size,
        "architecture": t.architecture,
        "seed": t.seed,
    }


def corpus_lines(t: TinyModelConfig):
    """Every string value of every row of the corpus files (JSON list or JSONL)."""
    for file in t.corpus:
        text = Path(file).read_text()
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(x) for x in text.splitlines() if x.strip()]
        )
        for row in rows:
            yield from _strings(row)


def _strings(value):
    """Every string inside ``value`` (rows, chat messages and their parts), images (data URLs) left out."""
    if isinstance(value, str):
        if not value.startswith("data:"):
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def load_policy(path: str, cfg: TriviumConfig):
    """The policy and its tokenizer from a model folder, or from a LoRA adapter folder (a checkpoint of a
    LoRA stage: its base model, with the adapter, trainable)."""
    from trivium.models import lora
    from trivium.models.loading import load_causal_lm, load_tokenizer, resolve_device, resolve_dtype

    device = resolve_device(cfg.model.device)

    def load(source: str):
        return load_causal_lm(source, dtype=resolve_dtype(cfg.model.dtype), device=device)

    if lora.is_adapter_folder(path):
        policy = lora.load_adapter(path, cfg.model.path, load)
    else:
        policy = load(path)
    if cfg.model.freeze_vision:
        from trivium.models.vision import freeze_vision_tower

        log.info("model.freeze_vision: %d vision-tower parameters frozen", freeze_vision_tower(policy))
    return policy, load_tokenizer(path)


ROLLOUT_WEIGHTS = ("copy", "take", "share")


def rollout_policy(policy: torch.nn.Module, weights: str) -> tuple[torch.nn.Module, str]:
    """What rollout engines run of ``policy`` and how they hold it (``build_rollout_model``): LoRA adapters
    merged into a copy of their own, which the engine takes (docs/scale.md)."""
    from trivium.models import lora

    if weights not in ROLLOUT_WEIGHTS:
        raise ValueError(f"weights must be one of {ROLLOUT_WEIGHTS}, got {weights!r}")
    if lora.is_peft(policy):
        return lora.merged_copy(policy), "take"
    return policy, weights


def why_rollout_copies_weights(cfg: TriviumConfig) -> str:
    """Why the stage's in-process rollout engine needs weights of its own, or ``""`` when it can sample from
    the trainer's own weight tensors (``build_rollout_model``'s ``"share"``).

    Sharing is exact when the engine samples only between train steps and every sample is meant to come
    from the newest weights: mode both with ``synchronizer.method`` memory, ``sync_interval`` 1 and
    ``sync_offset`` 0 (the explorer's step returns before the trainer's starts, and each published version
    is the trainer's weights as they stand), or a dataset stage (SFT, DPO) whose engine only evaluates,
    after the loop brings it the newest weights. The trainer must keep the tensors it was given (one rank,
    ``trainer.strategy`` single, no LoRA) in the engine's dtype on its device (``build_rollout_model``
    checks the dtype; the doctor's estimate too). A copy costs a model's weights of memory (2 GB for a
    0.5B model in float32) and a copy of them at every sync."""
    r, s, t = cfg.explorer.rollout, cfg.synchronizer, cfg.trainer
    if cfg.mode not in ("both", "train") or (cfg.mode == "train" and cfg.buffer.storage is not None):
        return f"mode {cfg.mode}: no trainer in this process samples from the engine's model"
    if cfg.cluster.backend != "local":
        return f"cluster.backend {cfg.cluster.backend}: the engines run in processes of their own"
    if r.engine_type != "transformers":
        return f"explorer.rollout.engine_type {r.engine_type} loads the weights into its own memory"
    if cfg.model.lora is not None:
        return "model.lora: the engine samples from the adapters merged into a copy"
    if t.strategy != "single" or t.world_size != 1:
        return f"trainer.strategy {t.strategy} over {t.world_size} rank(s) wraps or shards the weights"
    if cfg.mode == "both":
        if s.method != "memory":
            return f"synchronizer.method {s.method} sends copies"
        if s.sync_interval != 1 or s.sync_offset != 0:
            return (
                f"synchronizer.sync_interval {s.sync_interval} / sync_offset {s.sync_offset}: the engine "
                "samples from older weights while the trainer updates its own"
            )
        if r.in_flight_updates:
            return "explorer.rollout.in_flight_updates: the engine loads weights inside a running batch"
    return ""


def build_rollout_model(
    policy: torch.nn.Module, tokenizer, cfg: TriviumConfig, version: int, *, weights: str = "copy"
):
    """A batching rollout engine over ``policy``'s weights, held as ``weights`` says (see below).

    ``explorer.rollout.engine_type``: 'transformers' runs an in-process engine with
    ``explorer.rollout.dtype``/``autocast_dtype``, over a deep copy of the policy (``weights`` "copy", synced
    in memory), over the policy itself ("take": nothing trains it in this process; it is cast to the
    rollout dtype and put in eval mode), or over a module tree of its own (its own config, buffers and eval
    mode) whose parameters are the policy's own tensors ("share", where ``why_rollout_copies_weights`` says
    nothing stands against it: the trainer's updates are the engine's, a publish copies nothing; taken only
    when the rollout dtype is the policy's, else a copy). 'vllm' starts vLLM on the policy's current
    weights (written with save_pretrained to a temporary folder that lives as long as the engine, since
    vLLM loads from a folder) or, in a later stage of the same process, reuses the engine already running
    and loads the policy's weights into it in place (see models/vllm_engine.py).
    """
    from trivium.models.batching import BatchingRolloutModel
    from trivium.models.bf16 import rollout_dtype

    policy, weights = rollout_policy(policy, weights)
    r = cfg.explorer.rollout
    param = next(policy.parameters())
    dtype, why = rollout_dtype(
        r.dtype, param.dtype, param.device, r.engine_type, cfg.trainer.precision, r.autocast_dtype
    )
    if r.dtype == "auto":
        log.info("explorer.rollout.dtype auto -> %s: %s", str(dtype).removeprefix("torch."), why)
    if r.engine_type == "vllm":
        from trivium.models.vllm_engine import VllmEngine

        vllm_engine = VllmEngine.for_policy(
            policy,
            tokenizer,
            version=version,
            seed=cfg.seed,
            dtype=dtype,
            kv_cache_gb=r.vllm_kv_cache_gb,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization,
            enforce_eager=r.vllm_enforce_eager,
        )
        return BatchingRolloutModel(vllm_engine)

    from trivium.models.transformers_engine import TransformersEngine

    if weights == "share" and dtype != param.dtype:
        log.info(
            "rollout engine: a %s copy of the %s weights (explorer.rollout.dtype), not the trainer's own",
            str(dtype).removeprefix("torch."),
            str(param.dtype).removeprefix("torch."),
        )
        weights = "copy"
    if weights == "share":
        policy = sharing_copy(policy)
        log.info("rollout engine: samples from the trainer's own weight tensors (no copy of its own)")
    elif weights == "copy":
        policy = copy.deepcopy(policy).eval()
        for p in policy.parameters():
            p.requires_grad_(False)
    engine = TransformersEngine(
        policy,
        tokenizer,
        device=param.device,
        dtype=dtype,
        seed=cfg.seed,
        autocast_dtype=r.autocast_dtype,
        in_flight_updates=r.in_flight_updates,
    )
    engine.version = version
    engine.vision = vision_processor(cfg, policy)
    return BatchingRolloutModel(engine)


def sharing_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A module tree of its own (config, buffers, train/eval flags, attention implementation) whose
    parameters are ``policy``'s very tensors, in eval mode: what the trainer changes, it samples from."""
    memo = {id(p): p for p in policy.parameters()}
    return copy.deepcopy(policy, memo).eval()


def image_store_root(cfg: TriviumConfig) -> Path:
    """Where a run keeps the images its tasks bring (``models/vision.ImageStore``): ``<run folder>/images``."""
    return Path(cfg.checkpoint_root) / cfg.project / cfg.name / "images"


def vision_processor(cfg: TriviumConfig, model: torch.nn.Module):
    """The image processor and store of a vision-language ``model`` (from the folder it was loaded from,
    which holds ``preprocessor_config.json``), or None for a text model."""
    from trivium.models.vision import is_vision_config

    if not is_vision_config(getattr(model, "config", None)):
        return None
    # a model built from its config (a trainer rank) has no folder: the run's model folder has the processor
    source = (
        getattr(model, "name_or_path", "")
        or cfg.model.path
        or str(image_store_root(cfg).parent / "base_model")
    )
    return vision_from_folder(cfg, source)


def vision_from_folder(cfg: TriviumConfig, source: str):
    """``VisionProcessor`` of the model folder ``source`` over the run's image store."""
    from trivium.models.vision import ImageStore, VisionProcessor

    return VisionProcessor.from_pretrained(source, ImageStore(image_store_root(cfg)))


def sampling_params(cfg: TriviumConfig) -> tuple[SamplingParams, SamplingParams]:
    r = cfg.explorer.rollout
    rollout = SamplingParams(
        n=1,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        stop=tuple(r.stop),
    )
    e = cfg.explorer.eval
    evaluation = SamplingParams(
        n=e.repeat_times,
        temperature=e.temperature,
        top_p=1.0 if e.temperature == 0 else r.top_p,
        top_k=0 if e.temperature == 0 else r.top_k,
        max_tokens=r.max_tokens,
        stop=tuple(r.stop),
    )
    return rollout, evaluation


def task_reader(ts: TaskSetConfig, seed: int, is_eval: bool, field: str = "buffer.taskset"):
    from trivium.buffer.sources import section_rows
    from trivium.buffer.task_reader import TaskSetReader
    from trivium.rewards.registry import reward_task_fields
    from trivium.workflows.registry import get_workflow

    workflow = get_workflow(ts.workflow)
    name = ts.name or Path(ts.path).stem
    rows = section_rows(ts, name, field)  # None: the reader reads the file itself
    return TaskSetReader(
        ts.path if rows is None else rows,
        name=name,
        fields={**{k: k for k in (*workflow.fields, *reward_task_fields(ts.reward_fn))}, **ts.fields},
        required=workflow.fields,
        workflow=ts.workflow,
        reward_fn=ts.reward_fn,
        repeat_times=1 if is_eval else ts.repeat_times,
        workflow_args=ts.workflow_args,
        reward_args=ts.reward_args,
        reward_timeout_s=ts.reward_timeout_s,
        on_long_row=ts.on_long_row,
        is_eval=is_eval,
        on_bad_row=ts.on_bad_row,
        shuffle=ts.shuffle and not is_eval,
        seed=seed,
        max_rows=ts.max_rows,
        all_columns=workflow.reads_all_columns,
    )


def train_tasks(cfg: TriviumConfig):
    """The explorer's task stream: ``buffer.tasksets`` (or the one ``buffer.taskset``) mixed by weight, each
    read by ``buffer.selector`` (unset: shuffle, or sequential for a task set with shuffle false)."""
    from trivium.buffer.selectors import SELECTORS
    from trivium.buffer.task_feed import TaskFeed, TaskSource

    b = cfg.buffer
    sources = []
    for i, ts in enumerate(b.tasksets or [b.taskset]):
        reader = task_reader(
            ts, cfg.seed, is_eval=False, field=f"buffer.tasksets[{i}]" if b.tasksets else "buffer.taskset"
        )
        selector = SELECTORS.get(b.selector or ("shuffle" if ts.shuffle else "sequential"))
        chosen = selector(reader.all_tasks(), seed=cfg.seed, **b.selector_args)
        sources.append(TaskSource(reader.name, reader.all_tasks(), ts.weight, chosen, reader.skipped_rows))
    return TaskFeed(sources)


def total_steps(cfg: TriviumConfig, dataset_len: int) -> int:
    if cfg.buffer.total_steps:
        return cfg.buffer.total_steps
    return cfg.buffer.total_epochs * math.ceil(dataset_len / cfg.buffer.batch_size)


def load_auxiliary(cfg: TriviumConfig, name: str) -> torch.nn.Module:
    """The frozen auxiliary model called ``name`` (e.g. the distillation teacher), on the policy's device."""
    from trivium.models.loading import load_causal_lm, resolve_device, resolve_dtype

    by_name = {aux.name: aux for aux in cfg.auxiliary_models}
    if name not in by_name:
        raise ValueError(
            f"the algorithm needs auxiliary model '{name}', but auxiliary_models names only "
            f"{sorted(by_name) or 'none'}: add `auxiliary_models: [{{name: {name}, path: <folder>}}]`"
        )
    aux = by_name[name]
    device = resolve_device(cfg.model.device)
    model = load_causal_lm(aux.path, dtype=resolve_dtype(aux.dtype), device=device)
    return model.eval().requires_grad_(False)


def make_critic(cfg: TriviumConfig, policy: torch.nn.Module, total_steps: int):
    from trivium.trainer.critic import Critic, ValueModel

    c = cfg.algorithm.critic
    base = policy
    if c.path:
        from trivium.models.loading import load_causal_lm

        param = next(policy.parameters())
        base = load_causal_lm(c.path, dtype=param.dtype, device=param.device)
    updates = total_steps * cfg.trainer.ppo_epochs * max(1, _minibatches(cfg))
    return Critic(ValueModel.from_causal_lm(base), c, cfg.trainer, updates, cfg.explorer.rollout.max_tokens)


def _minibatches(cfg: TriviumConfig) -> int:
    batch = cfg.buffer.batch_size * (cfg.buffer.taskset.repeat_times if cfg.buffer.taskset else 1)
    return batch // cfg.trainer.mini_batch_size if cfg.trainer.mini_batch_size else 1


def kl_penalty_controller(cfg):
    """``algorithm.kl_penalty``'s β controller (the algorithm's one factory), or None when it is off."""
    from trivium.algorithm.rewards_shaping import kl_controller

    if cfg.coef <= 0:
        return None
    return kl_controller(cfg.coef, adaptive=cfg.adaptive, target=cfg.target_kl, horizon=cfg.horizon)


def sample_strategy(cfg: TriviumConfig, tokenizer):
    """The stage's sample strategy (the preset's unless ``algorithm.sample_strategy`` overrides it)."""
    from trivium.algorithm.presets import get_preset
    from trivium.buffer.sampling import SAMPLE_STRATEGIES, build_strategy

    name = cfg.algorithm.sample_strategy or get_preset(cfg.algorithm.algorithm_type).sample_strategy
    return build_strategy(SAMPLE_STRATEGIES.get(name), cfg, tokenizer, cfg.algorithm.sample_strategy_args)


def storage(cfg: TriviumConfig, run_dir: Path):
    """The persistent experience storage of ``buffer.storage``: SQL (SQLite in the run folder by default, or
    a SQLAlchemy URL) or one JSONL file (``backend: jsonl``)."""
    return _STORAGES[cfg.buffer.storage.backend](cfg.buffer.storage, run_dir)


def _jsonl_storage(s, run_dir: Path):
    from trivium.buffer.storage_jsonl import JsonlStorage

    return JsonlStorage(s.url or run_dir / "buffer.jsonl")


def _sql_storage(s, run_dir: Path):
    from trivium.buffer.storage_sql import SqlStorage

    return SqlStorage(s.url or run_dir / "buffer.sqlite", table=s.table)


_STORAGES = {"jsonl": _jsonl_storage, "sql": _sql_storage}  # buffer.storage.backend's choices


def read_policy(cfg: TriviumConfig):
    """How the trainer reads ``buffer.storage``: every experience once (fifo) or by priority (replay)."""
    return _READ_POLICIES[cfg.buffer.storage.policy](cfg.buffer.storage.replay)


def _fifo(replay):
    from trivium.buffer.replay import FIFO

    return FIFO


def _replay(r):
    from trivium.buffer.replay import ReplayPolicy

    return ReplayPolicy(
        version_weight=r.version_weight,
        use_weight=r.use_weight,
        cooldown_steps=r.cooldown_steps,
        max_uses=r.max_uses,
    )


_READ_POLICIES = {"fifo": _fifo, "replay": _replay}  # buffer.storage.policy's choices


def feed(cfg: TriviumConfig, run_dir: Path, per_step: int, explore_process: str | None = None):
    """The explorer-to-trainer channel: ``buffer.storage`` when configured (with its read policy), else a
    bounded in-process queue (two train batches, plus the steps the explorer may run ahead).
    ``explore_process``: the stage whose explore process writes the storage (a decoupled train process):
    its reads watch that process's heartbeat (``explore_heartbeat.py``)."""
    from trivium.buffer.feed import MemoryFeed, StorageFeed
    from trivium.buffer.queue import ExperienceQueue
    from trivium.launch.explore_heartbeat import ExploreWatch, heartbeat_path

    s = cfg.buffer.storage
    if s is not None:
        watch = None
        if explore_process is not None:
            watch = ExploreWatch(heartbeat_path(run_dir, explore_process), explore_process)
        return StorageFeed(
            storage(cfg, run_dir), policy=read_policy(cfg), timeout_s=s.read_timeout_s, waiting=watch
        )
    capacity = cfg.buffer.queue_capacity or (2 + cfg.synchronizer.sync_offset) * per_step
    return MemoryFeed(ExperienceQueue(capacity))


def make_trainer(cfg: TriviumConfig, model: torch.nn.Module, pad_token_id: int, total: int, parallel=None):
    """The trainer for ``cfg``'s algorithm over ``model`` (LoRA adapters already attached, see
    ``lora.prepare``), with the frozen models and the critic it needs; ``parallel``: the rank's
    ``trainer.strategy`` (default: single)."""
    from trivium.algorithm.presets import get_preset
    from trivium.models import lora
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer

    preset = get_preset(cfg.algorithm.algorithm_type)

    def frozen_copy():
        return copy.deepcopy(model).eval().requires_grad_(False)

    if preset.offline_data == "preference":
        from trivium.trainer.dpo import DpoTrainer

        return DpoTrainer(
            model, frozen_copy(), cfg.trainer, cfg.algorithm.dpo, pad_token_id=pad_token_id, total_steps=total
        )
    algorithm = AlgorithmSpec.from_config(cfg.algorithm)
    if cfg.algorithm.rollout_is_cap is None and preset.needs_rollouts:
        from trivium.launch.rollout_correction import rollout_is_cap

        algorithm = dataclasses.replace(algorithm, rollout_is_cap=rollout_is_cap(cfg, model))
    a = cfg.algorithm
    needs_ref = algorithm.kl_coef > 0 or a.kl_penalty.coef > 0 or preset.needs_reference
    base_is_reference = needs_ref and lora.is_peft(model)  # the base, adapters disabled: no copy
    return Trainer(
        model,
        cfg.trainer,
        algorithm,
        pad_token_id=pad_token_id,
        total_steps=total,
        temperature=cfg.explorer.rollout.temperature,
        max_response_length=cfg.explorer.rollout.max_tokens,
        ref_model=frozen_copy() if needs_ref and not base_is_reference else None,
        reference_is_base=base_is_reference,
        teacher_model=load_auxiliary(cfg, a.teacher) if preset.needs_teacher else None,
        critic=make_critic(cfg, model, total) if preset.needs_critic else None,
        kl_penalty=kl_penalty_controller(a.kl_penalty),
        kl_penalty_estimator=a.kl_penalty.estimator,
        overlong=a.overlong_penalty if a.overlong_penalty.enabled else None,
        seed=cfg.seed,
        parallel=parallel,
        vision=vision_processor(cfg, lora.base_model(model) if lora.is_peft(model) else model),
    )


def make_explorer(
    cfg: TriviumConfig, state, taskset=None, queue=None, failure_log: Path | None = None, *, model=None
):
    """An explorer in this process over a rollout copy of ``state.model`` (or over ``model``, a rollout
    model already built: ``Placement.rollout_engine``); ``queue``: anything with ``put(experiences)``.
    ``failure_log``: a JSONL file that gets one line per failed task or episode. Where it runs is the
    placement's to say (``Placement.explorer``)."""
    from trivium.explorer.explorer import Explorer
    from trivium.faults import FaultInjector, FaultRates

    rates = FaultRates.from_config(cfg.faults)
    rollout_params, eval_params = sampling_params(cfg)
    if model is None:
        model = build_rollout_model(state.model, state.tokenizer, cfg, state.version)
    evals = [
        task_reader(ts, cfg.seed, is_eval=True, field=f"buffer.eval_tasksets[{i}]")
        for i, ts in enumerate(cfg.buffer.eval_tasksets)
    ]
    return Explorer(
        model,
        rollout_params=rollout_params,
        eval_params=eval_params,
        taskset=taskset,
        eval_tasksets=evals,
        queue=queue,
        batch_size=cfg.buffer.batch_size,
        max_concurrency=cfg.explorer.max_concurrency,
        dynamic_sampling=cfg.algorithm.dynamic_sampling.enabled,
        max_sampling_rounds=cfg.algorithm.dynamic_sampling.max_rounds,
        max_retries=cfg.explorer.max_retries,
        timeouts=task_timeouts(cfg),
        over_rollout_ratio=cfg.explorer.over_rollout.ratio,
        over_rollout_wait_s=cfg.explorer.over_rollout.wait_after_min,
        failure_sink=None if failure_log is None else jsonl_appender(failure_log),
        faults=None if rates is None else FaultInjector(rates),
        experience_ops=experience_ops(cfg),
    )


def task_timeouts(cfg: TriviumConfig):
    """Each explore task's time limit: ``explorer.workflow_timeout_s``, or ``explorer.dynamic_timeout``."""
    from trivium.explorer.timeouts import TaskTimeouts

    e, d = cfg.explorer, cfg.explorer.dynamic_timeout
    ratio = d.ratio if d.enable else 0.0
    return TaskTimeouts(e.workflow_timeout_s, ratio=ratio, window=d.window, min_samples=d.min_samples)


def experience_ops(cfg: TriviumConfig):
    """``buffer.experience_ops`` as a pipeline (None when empty); ``algorithm.dynamic_sampling`` puts
    ``zero_variance`` first when the list does not name it."""
    from trivium.buffer.operators import ExperiencePipeline

    steps = [(op.name, op.args) for op in cfg.buffer.experience_ops]
    if cfg.algorithm.dynamic_sampling.enabled and "zero_variance" not in [name for name, _ in steps]:
        steps.insert(0, ("zero_variance", {}))
    return ExperiencePipeline(steps, max_tokens=cfg.explorer.rollout.max_tokens) if steps else None


def jsonl_appender(path: Path):
    """A thread-safe ``record -> None`` that appends one JSON line to ``path`` (flushed at once)."""
    import threading
    import time

    lock = threading.Lock()

    def append(record: dict) -> None:
        line = json.dumps({"time": time.time(), **record}, default=str)
        with lock, open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    return append
