"""``trivium doctor CONFIG``: what a config means, stage by stage, in words and numbers, before it runs.

For each stage: experiences per step (tasks x repeat_times), mini-batches and optimizer steps per step,
micro-batches per rank, the longest sequence and the tokens a step trains at most, weights versions
between syncs and the staleness bound, total steps from epochs, and the memory each role needs
(``memory_estimate.py``). Not the stall doctor of a running run (``launch/doctor.py``).

It reads the data files (row counts, the longest prompt and answer in tokens) and the model's
``config.json`` (parameters counted on the meta device: no weights are loaded); for a ``model.tiny`` recipe
whose folder does not exist yet it builds the recipe's tokenizer in memory. It writes nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from trivium.launch.build import why_rollout_copies_weights
from trivium.launch.memory_estimate import DTYPE_BYTES, Estimate, ModelShape, Shapes, estimate, mib
from trivium.launch.placement import PLACEMENTS
from trivium.launch.rollout_correction import rollout_is_cap
from trivium.trainer.layout import SHARE_AT, shared_row_shape
from trivium.trainer.parallel import STRATEGIES, micro_cap, micro_rows
from trivium.validation.validate_layout import engine_dtype, engine_dtype_why


@dataclass
class StageFacts:
    """The derived numbers of one stage (the text is made from them; tests read them)."""

    name: str
    lines: list[str]
    shapes: Shapes | None
    estimate: Estimate | None
    total_steps: int | None
    advice: list = dataclasses.field(default_factory=list)  # doctor_advice.Advice, in the order printed


def model_and_tokenizer(cfg):
    """The transformers config, the parameter count and a tokenizer, without loading weights."""
    import torch
    from transformers import AutoConfig

    from trivium.models.loading import auto_model_class

    path = cfg.model.path
    if path and Path(path).exists():
        from trivium.models.loading import load_tokenizer

        config, tokenizer = AutoConfig.from_pretrained(path), load_tokenizer(path)
    elif cfg.model.tiny is not None and cfg.model.tiny.architecture == "qwen2_vl":
        import tempfile

        from trivium.launch.build import ensure_model
        from trivium.models.loading import load_tokenizer

        with tempfile.TemporaryDirectory() as tmp:  # the tiny VLM's tokenizer and template come with it
            folder = ensure_model(
                cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": ""})}), Path(tmp)
            )
            config, tokenizer = AutoConfig.from_pretrained(folder), load_tokenizer(folder)
    elif cfg.model.tiny is not None:
        from trivium.launch.build import corpus_lines
        from trivium.models.tiny import build_tokenizer, recipe_config

        t = cfg.model.tiny
        tokenizer = build_tokenizer(list(corpus_lines(t)), t.vocab_size, 4096)
        config = recipe_config(t, vocab_size=len(tokenizer))
    else:
        raise FileNotFoundError(f"model.path {path!r} does not exist and there is no model.tiny recipe")
    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    params = sum(p.numel() for p in model.parameters())
    c = model.config.get_text_config()  # a vision-language model: its language model (the tower is small)
    heads = c.num_attention_heads
    shape = ModelShape(
        params=params,
        layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        heads=heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        intermediate=c.intermediate_size,
        vocab=c.vocab_size,
        tied=bool(getattr(c, "tie_word_embeddings", False)),
    )
    return shape, model, tokenizer


def lora_params(model, lora) -> int:
    """Adapter parameters: rank x (in + out) for every targeted linear layer (all-linear: all but the head)."""
    import torch

    names = lora.target_modules
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        if names == "all-linear" or name.rsplit(".", 1)[-1] in names:
            total += lora.rank * (module.in_features + module.out_features)
    return total


def longest_prompt(ts, tokenizer, seed: int, image_tokens: int | None = None) -> tuple[int, int]:
    """(rows, longest rendered prompt in tokens) of a task set (``workflows.registry.prompt_lengths``; an
    image counted as ``image_tokens``)."""
    from trivium.launch import build
    from trivium.workflows.registry import prompt_lengths

    reader = build.task_reader(ts, seed, is_eval=False)
    lengths = prompt_lengths(
        reader.all_tasks(), ts.workflow, ts.workflow_args, tokenizer, image_tokens=image_tokens
    )
    return len(reader), max(lengths, default=0)


def episode_sizes(cfg, tokenizer, probe_tasks: int = 8):
    """(rows, the largest ``EpisodeSize`` over the first ``probe_tasks`` tasks) of a multi-turn workflow's
    task set (its environment reset and stepped once per task), or None for other workflows."""
    from trivium.launch import build
    from trivium.workflows.multi_turn import MultiTurnWorkflow
    from trivium.workflows.registry import get_workflow

    ts = cfg.buffer.taskset
    cls = get_workflow(ts.workflow)
    if not (isinstance(cls, type) and issubclass(cls, MultiTurnWorkflow)):
        return None
    workflow = cls(**dict(ts.workflow_args))
    reader = build.task_reader(ts, cfg.seed, is_eval=False)
    tasks = reader.all_tasks()[:probe_tasks]
    sizes = [workflow.episode_size(t, tokenizer, image_tokens(cfg)) for t in tasks]
    return len(reader), max(sizes, key=lambda z: z.opening + z.reply)


def longest_example(cfg, tokenizer) -> tuple[int, int, int]:
    """(rows, longest prompt + response, longest response) in tokens of the SFT or preference dataset."""
    from trivium.buffer.offline import PreferenceReader, SftReader

    b = cfg.buffer
    if b.sft_dataset is not None:
        reader = SftReader(b.sft_dataset, tokenizer, seed=cfg.seed, image_tokens=image_tokens(cfg))
        examples = [[reader.to_experience(t)] for t in reader.reader.all_tasks()]
    else:
        reader = PreferenceReader(b.preference_dataset, tokenizer, seed=cfg.seed)
        examples = [reader.to_experiences(t) for t in reader.reader.all_tasks()]
    lengths = [max(int(e.tokens.numel()) for e in pair) for pair in examples]
    responses = [max(int(e.action_mask.numel()) for e in pair) for pair in examples]
    return len(lengths), max(lengths, default=0), max(responses, default=0)


def image_tokens(cfg) -> int | None:
    """Tokens the doctor counts per image of a vision-language policy (its processor's largest image; the
    tiny VLM's image_size**2 / 28**2 before it exists); None for a text model."""
    from trivium.validation.validate_vision import is_vision_policy

    if not is_vision_policy(cfg):
        return None
    if cfg.model.path and Path(cfg.model.path).exists():
        from transformers import AutoImageProcessor

        from trivium.models.vision import max_image_tokens

        return max_image_tokens(AutoImageProcessor.from_pretrained(cfg.model.path))
    return (cfg.model.tiny.image_size // 28) ** 2  # the tiny VLM's largest image: a token per 28 x 28 pixels


@dataclass(frozen=True)
class _Batch:
    """One step's data, as the doctor counts it."""

    experiences: int  # sequences per step
    seq: int  # the longest sequence (a packed row's length with packing)
    response: int  # its response tokens (a packed row's share)
    rows: int  # rows of the data (tasks, or examples)
    unit: str  # what a row is: "tasks" or "rows"
    per_row: int = 1  # sequences a trained row holds (a task's samples in one row: trainer.share_prompts)
    sampled: int = 0  # the longest sequence sampled (seq before packing or sharing rows)


def stage_facts(stage, index: int, count: int, memory: float | None = None) -> StageFacts:
    """What one stage means: its quantities per step, its weights' staleness and its memory, in lines, and
    what the doctor suggests (``doctor_advice``; ``memory``: the budget in bytes, else the device's)."""
    from trivium.algorithm.presets import get_preset

    cfg = stage.config
    head = (
        f"stage {index + 1}/{count} {stage.name} (mode {cfg.mode}, algorithm {cfg.algorithm.algorithm_type})"
    )
    if cfg.mode in ("bench", "serve"):
        what = "evaluates checkpoints" if cfg.mode == "bench" else "serves the policy"
        return StageFacts(stage.name, [head, f"  {what}: no training steps"], None, None, None)
    shape, model, tokenizer = model_and_tokenizer(cfg)
    b, t = cfg.buffer, cfg.trainer
    explores = cfg.mode in ("both", "explore") or (cfg.mode == "train" and b.storage is not None)
    trains = cfg.mode != "explore"  # the explore process of a decoupled run samples only
    preset = get_preset(cfg.algorithm.algorithm_type)
    batch, lines = _batch_lines(cfg, tokenizer, explores)
    total = b.total_steps or b.total_epochs * math.ceil(batch.rows / b.batch_size)
    more, fullest_rows = _update_lines(cfg, batch, total, trains)
    lines = [head, *lines, *more, *_staleness_lines(cfg)]
    shapes = _shapes(cfg, preset, shape, model, tokenizer, batch, fullest_rows, explores)
    shards = t.world_size if STRATEGIES.get(t.strategy).shards_parameters else 1
    precision = trainer_precision(cfg) if trains else None
    autocast = precision is not None and precision.name in ("bf16", "fp16")

    def estimate_with(s: Shapes, rollout_dtype: str | None = None, shards: int = shards) -> Estimate:
        est = estimate(shape, s, cfg.model.dtype, rollout_dtype or engine_dtype(cfg), shards, autocast)
        if not trains:  # the engine takes the policy over (no copy): its weights, KV cache and prefill only
            est.parts.pop("trainer")
            est.steady, est.train_transient, est.heap = est.parts["rollout"].get("weights", 0.0), 0.0, 0.0
        return est

    est = estimate_with(shapes)
    if precision is not None:
        lines.append(f"  precision    {precision.describe(t.precision)}")
    if "rollout" in est.parts:
        dtype, why = engine_dtype_why(cfg)
        setting = cfg.explorer.rollout.dtype or "null"
        cap = rollout_is_cap(cfg, quiet=True) if preset.needs_rollouts and trains else 0.0
        if cap > 0:  # the trainer corrects for the sampler's other numerics (or staleness)
            unset = (
                " unset: on for a sampler in another dtype" if cfg.algorithm.rollout_is_cap is None else ""
            )
            why += f"; the trainer weighs each token by min(pi_trainer / pi_rollout, {cap:g}) (algorithm.rollout_is_cap{unset})"
        lines.append(f"  rollout      {dtype} weights (explorer.rollout.dtype {setting}): {why}")
    lines += memory_lines(shape, shapes, est, cfg)

    def in_flight_at(concurrency: int) -> int:
        return _shapes(
            cfg, preset, shape, model, tokenizer, batch, fullest_rows, explores, concurrency
        ).in_flight

    where = f"stages.{index}." if count > 1 else ""  # a stage's own section wins over the top level's
    advice, advice_lines = _advice(
        cfg,
        shapes,
        est,
        estimate_with,
        model,
        trains,
        memory,
        in_flight_at,
        where,
        total,
        precision,
        shape,
    )
    return StageFacts(stage.name, lines + advice_lines, shapes, est, total, advice)


def _advice(
    cfg, shapes, est, estimate_with, model, trains, memory, in_flight_at, where, steps, precision, shape
) -> tuple[list, list[str]]:
    """The doctor's suggestions for the stage (``doctor_advice``), each setting as the path ``--set`` takes
    (``where``: ``stages.<i>.`` in a run of several stages), and their lines."""
    from trivium.config.schema import LoraConfig
    from trivium.launch.doctor_advice import FILL, SPEED_SETTINGS, advise, memory_budget
    from trivium.models.bf16 import native_bf16
    from trivium.models.loading import resolve_device

    device = resolve_device(cfg.model.device)
    budget = memory_budget(device, memory)
    advice = advise(
        cfg,
        shapes,
        estimate_with,
        budget,
        native_bf16(device),
        lambda: lora_params(model, LoraConfig()),
        trains,
        in_flight_at,
        steps,
        None if precision is None else precision.name,
        device.type,
        shape.params,
        shape.vocab,
    )
    advice = [
        dataclasses.replace(a, setting=_setting_path(a.setting, where)) if a.setting else a for a in advice
    ]
    lines = [f"  advice       {a.line()}" for a in advice]
    if budget is None:
        lines.append(
            "  advice       memory: this machine's memory could not be read; pass --memory SIZE to check a plan"
        )
    elif all(a.setting in [_setting_path(k, where) for k in SPEED_SETTINGS] for a in advice):
        lines.append(
            f"  advice       memory: fits, the estimated peak {mib(est.peak)} is {est.peak / budget.bytes:.0%} of "
            f"{mib(budget.bytes)} ({budget.source}; the doctor keeps a plan within {FILL:.0%})"
        )
    return advice, lines


def _setting_path(setting: str, where: str) -> str:
    """``setting`` as ``--set`` takes it: under the stage's ``where`` (``stages.<i>.``), but a run-level key
    (``runtime``, ``cluster``) for the whole run, as a stage cannot change it."""
    from trivium.validation.load import RUN_LEVEL_KEYS

    return setting if setting.split(".")[0] in RUN_LEVEL_KEYS else where + setting


def _batch_lines(cfg, tokenizer, explores: bool) -> tuple[_Batch, list[str]]:
    """Experiences and tokens per step: sampled from the task set, or read from a dataset."""
    b, t, r = cfg.buffer, cfg.trainer, cfg.explorer.rollout
    k = prompt = 0
    if explores and b.taskset is not None:
        k = b.taskset.repeat_times
        episodes = episode_sizes(cfg, tokenizer)
        if episodes is not None:
            rows, size = episodes
            seq, prompt = size.tokens(r.max_tokens), size.opening
            response = seq - size.opening
            how = (
                "the reply to an empty turn, an upper bound where valid turns get shorter replies"
                if size.measured
                else "the opening's last message: an empty turn ended the episode"
            )
            tokens_line = (
                f"  tokens       an episode: opening {size.opening} tokens + {size.max_turns} turns (workflow_args."
                f"max_turns) of at most {r.max_tokens} sampled + {size.reply} from the environment (measured: "
                f"{how}) = {seq} per sequence; at most {b.batch_size * k * seq:,} tokens per step"
            )
        else:
            rows, prompt = longest_prompt(b.taskset, tokenizer, cfg.seed, image_tokens(cfg))
            seq, response = prompt + r.max_tokens, r.max_tokens
            tokens_line = (
                f"  tokens       longest prompt {prompt} tokens + at most {r.max_tokens} sampled "
                f"(explorer.rollout.max_tokens) = {seq} per sequence; at most {b.batch_size * k * seq:,} tokens "
                "per step"
            )
        experiences = b.batch_size * k
        lines = [
            f"  experiences  {b.batch_size} tasks per step (buffer.batch_size) x {k} samples each "
            f"(taskset.repeat_times) = {experiences} experiences per step",
            tokens_line,
        ]
        unit = "tasks"
    else:
        rows, seq, response = longest_example(cfg, tokenizer)
        experiences = b.batch_size
        lines = [
            f"  examples     {experiences} examples per step (buffer.batch_size)",
            f"  tokens       longest example {seq} tokens (prompt + response); at most "
            f"{experiences * seq:,} tokens per step",
        ]
        unit = "rows"
    sampled = seq
    if t.pack_length:  # a packed row holds several sequences: its responses' share of the row
        response = min(t.pack_length, math.ceil(t.pack_length * response / max(seq, 1)))
        seq = t.pack_length
        lines.append(f"               packed into rows of {seq} tokens (trainer.pack_length)")
    per_row = 1
    shareable = not (t.pack_length or image_tokens(cfg))  # trainer/layout.py's why_not_shared
    if k > 1 and prompt and t.share_prompts is not False and shareable:
        members, row = shared_row_shape(prompt, response, k, t.max_tokens_per_micro_batch)
        if t.share_prompts is True or row <= SHARE_AT * members * seq:
            lines.append(
                f"               a task's samples share a row (trainer.share_prompts: {t.share_prompts}): the "
                f"prompt once + {members} x (1 + {response}) = {row} tokens, {row / (members * seq):.0%} of "
                "one row a sample"
            )
            seq, response, per_row = row, members * response, members
    return _Batch(experiences, seq, response, rows, unit, per_row, sampled), lines


def _update_lines(cfg, batch: _Batch, total: int, trains: bool) -> tuple[list[str], int]:
    """Steps, optimizer updates and forward/backward passes; and the rows of the fullest pass."""
    b, t = cfg.buffer, cfg.trainer
    how = (
        "buffer.total_steps"
        if b.total_steps
        else f"{b.total_epochs} epoch(s) x ceil({batch.rows} {batch.unit} / {b.batch_size}) (buffer.total_epochs)"
    )
    lines = [f"  steps        {total} steps ({how}); the data has {batch.rows} {batch.unit}"]
    mini = t.mini_batch_size or batch.experiences
    minis = math.ceil(batch.experiences / mini)
    per_rank = _rows_per_update(cfg, batch)
    # memory: the fullest pass a batch can make. Shorter batches than the longest allow more rows a pass
    # under a token budget, up to about the budget's tokens, so the rows the budget caps at this width
    # (not the evenly spread ones) stand for it.
    fullest_rows = min(micro_cap(t.micro_batch_size, t.max_tokens_per_micro_batch, batch.seq), per_rank)
    if not trains:
        lines.append(
            "  updates      none in this process: the train process of the run trains what it writes"
        )
        return lines, fullest_rows
    lines.append(
        f"  updates      {batch.experiences} per step / {mini} per mini-batch (trainer.mini_batch_size"
        f"{' 0: the whole batch' if not t.mini_batch_size else ''}) = {minis} mini-batch(es) x "
        f"{t.ppo_epochs} ppo_epochs = {minis * t.ppo_epochs} optimizer step(s) per step, "
        f"{total * minis * t.ppo_epochs:,} in the stage"
    )
    rows_per_pass = min(
        micro_rows(t.micro_batch_size, t.max_tokens_per_micro_batch, per_rank, batch.seq), per_rank
    )
    budget = (
        f" and {t.max_tokens_per_micro_batch} tokens (trainer.max_tokens_per_micro_batch)"
        if t.max_tokens_per_micro_batch
        else ""
    )
    lines.append(
        f"  micro        {per_rank} rows per mini-batch on each of {t.world_size} rank(s), at most "
        f"{t.micro_batch_size} rows (trainer.micro_batch_size){budget} per pass = "
        f"{math.ceil(per_rank / rows_per_pass)} forward/backward pass(es) of up to {rows_per_pass} x "
        f"{batch.seq} tokens per optimizer step"
    )
    return lines, fullest_rows


def _rows_per_update(cfg, batch: _Batch) -> int:
    """Rows one rank trains between two optimizer steps: its share of a mini-batch."""
    t = cfg.trainer
    mini = t.mini_batch_size or batch.experiences
    return math.ceil(math.ceil(mini / t.world_size) / batch.per_row)


def _staleness_lines(cfg) -> list[str]:
    """How old an experience is when trained, for a stage that both samples and trains."""
    b, s = cfg.buffer, cfg.synchronizer
    if not (cfg.mode == "both" or (cfg.mode == "train" and b.storage is not None)):
        return []
    bound = s.sync_interval - 1 + s.sync_offset
    kept = (
        f" (max_staleness {s.max_staleness}: older ones {s.staleness_policy})"
        if s.max_staleness is not None
        else ""
    )
    return [
        f"  weights      synced every {s.sync_interval} step(s) (synchronizer.sync_interval): "
        f"{s.sync_interval} trainer version(s) per sync; the explorer runs up to {s.sync_offset} step(s) "
        f"ahead (sync_offset), so an experience is at most {s.sync_interval} - 1 + {s.sync_offset} = "
        f"{bound} version(s) old when trained{kept}"
    ]


def _shapes(
    cfg,
    preset,
    shape,
    model,
    tokenizer,
    batch: _Batch,
    fullest_rows: int,
    explores: bool,
    concurrency: int = 0,
) -> Shapes:
    """What the memory estimate sizes: the fullest pass, the sequences sampled at once (a step's tasks or
    an evaluation's), the trainable and frozen copies of the model. ``concurrency``: size it with this
    ``explorer.max_concurrency`` instead of the config's (the doctor's advice)."""
    b, r, a = cfg.buffer, cfg.explorer.rollout, cfg.algorithm
    needs_ref = a.kl_loss.coef > 0 or a.kl_penalty.coef > 0 or preset.needs_reference
    needs_ref = needs_ref or preset.offline_data == "preference"
    trainable = lora_params(model, cfg.model.lora) if cfg.model.lora is not None else shape.params
    in_flight = 0  # sequences the engine samples at once: a step's tasks, or an evaluation's
    concurrency = concurrency or cfg.explorer.max_concurrency
    if explores and b.taskset is not None and cfg.mode != "train":
        tasks = concurrency or b.batch_size
        in_flight = min(tasks, b.batch_size) * b.taskset.repeat_times
    rollout_seq = batch.sampled if in_flight else 0
    for ts in b.eval_tasksets:
        n, prompt = longest_prompt(ts, tokenizer, cfg.seed)
        in_flight = max(in_flight, min(concurrency or n, n) * cfg.explorer.eval.repeat_times)
        rollout_seq = max(rollout_seq, prompt + r.max_tokens)
    in_driver = PLACEMENTS.get(cfg.cluster.backend).engines_in_driver
    return Shapes(
        experiences=batch.experiences,
        rows_per_micro=fullest_rows,
        seq_len=batch.seq,
        loss_tokens=batch.response if projects_loss_tokens_only(model) else batch.seq,
        in_flight=in_flight,
        rollout_seq=rollout_seq,
        trainable=trainable,
        head_chunk=head_chunk_tokens(model, cfg, a.entropy_coef > 0),
        head_low_products=cfg.trainer.head_grad_precision == "autocast",
        frozen_copies=1 if needs_ref and cfg.model.lora is None else 0,
        critic=preset.needs_critic,
        rollout_engine=in_flight > 0 and r.engine_type == "transformers" and in_driver,
        rollout_shares_weights=not why_rollout_copies_weights(cfg),
        overlap=cfg.synchronizer.sync_offset > 0,
        moment_bytes=2 if cfg.trainer.optimizer_state_dtype == "bfloat16" else 0,
        shared_rows=batch.per_row > 1,
        recompute=cfg.trainer.gradient_checkpointing,
        rows_per_update=_rows_per_update(cfg, batch),
        grads_kept=cfg.trainer.strategy == "ddp",
    )


def projects_loss_tokens_only(model) -> bool:
    """Whether the trainer gives only the loss tokens' positions to the vocabulary head for this model
    (``trainer/logprobs.py``); a model it cannot (soft-capped logits, no ``logits_to_keep``) gets logits
    at every position."""
    from trivium.trainer.logprobs import output_head

    return output_head(model) is not None


def head_chunk_tokens(model, cfg, entropy: bool) -> int:
    """Loss tokens per chunk of the trainer's vocabulary head for this model (``ChunkedLogProbs``), 0 where
    it takes the whole ``[N, V]`` path: an entropy bonus, a head without float32 weights."""
    from trivium.trainer.logprobs import HEAD_CHUNK_VALUES, chunkable, output_head

    head = output_head(model)
    if entropy or head is None or cfg.model.dtype != "float32" or not chunkable(head):
        return 0
    return max(1, HEAD_CHUNK_VALUES // model.config.get_text_config().vocab_size)


def trainer_precision(cfg):
    """What ``trainer.precision`` becomes on this machine for this model (``trainer/precision.py``), or
    None where it cannot run here (check-config names that problem)."""
    from trivium.trainer.precision import resolve

    try:
        return resolve(cfg.trainer.precision, cfg.model)
    except ValueError:
        return None


def memory_lines(shape: ModelShape, shapes: Shapes, est: Estimate, cfg) -> list[str]:
    dtype, rdtype = cfg.model.dtype, engine_dtype(cfg)
    lines = [
        f"  model        {shape.params:,} parameters ({shape.layers} layers, hidden {shape.hidden}, "
        f"{shape.heads} heads / {shape.kv_heads} kv heads, MLP {shape.intermediate}, vocab {shape.vocab}); "
        f"{shapes.trainable:,} trainable",
        f"  memory       estimate per role (model.dtype {dtype}: {DTYPE_BYTES[dtype]} bytes per value):",
    ]
    for role, parts in est.parts.items():
        if role == "rollout":
            note = f"rollout ({rdtype}, {shapes.in_flight} sequences in flight x {shapes.rollout_seq} tokens)"
            if "weights" not in parts:
                note += ", sampling from the trainer's weights"
        else:
            note = (
                f"trainer (micro-batch {shapes.rows_per_micro} x {shapes.seq_len} tokens, "
                f"{min(shapes.loss_tokens, shapes.seq_len)} a row through the vocabulary head)"
            )
        lines.append(f"    {note}: " + ", ".join(f"{k} {mib(v)}" for k, v in parts.items()))
    how = "sampling and training at once" if est.overlap else "the larger of training and sampling"
    one_pass = (
        ": the larger of gradients and activations with the head's gradient, one pass an update"
        if "trainer" in est.parts and not shapes.grads_meet_activations
        else ""
    )
    lines.append(
        f"    peak       {mib(est.peak)}: weights and optimizer state {mib(est.steady)} + "
        + (f"the steps' heap {mib(est.heap)} + " if est.heap else "")
        + f"{how} "
        f"(training {mib(est.train_transient)}{one_pass}, sampling {mib(est.rollout_transient)})"
    )
    return lines


def explain(run_cfg, memory: float | None = None) -> tuple[str, list[StageFacts]]:
    """The doctor's text for a loaded ``RunConfig`` and the facts it is made from; ``memory``: the budget in
    bytes the advice plans for (``--memory``), else the trainer's device's."""
    facts = [stage_facts(s, i, len(run_cfg.stages), memory) for i, s in enumerate(run_cfg.stages)]
    text = "\n\n".join("\n".join(f.lines) for f in facts)
    peaks = [f.estimate.peak for f in facts if f.estimate is not None]
    if peaks:
        text += f"\n\nrun peak (largest stage): {mib(max(peaks))} of tensors and heap; the process adds its libraries."
    return text, facts
