"""The configuration schema: one pydantic model per component, the single home of every default (the
run-level sections, runtime / cluster / monitor / faults, are in ``schema_run.py``, the explorer's in
``schema_explorer.py``).

Each field has a type, a default and a docstring (pydantic reads attribute docstrings), so
``trivium check-config`` and generated docs come from this file alone. Models forbid unknown keys.
Checks that involve several fields or the outside world (files, registries) live in ``validate.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from trivium.config.schema_base import (  # noqa: F401 (re-exported: the bounds are part of the schema)
    COUNT_MAX,
    MIN_TEMPERATURE,
    SECONDS_MAX,
    SEED_MAX,
    STEPS_MAX,
    StrictModel,
)
from trivium.config.schema_data import (  # noqa: F401
    BufferDataFields,
    HubSourceFields,
    OperatorConfig,
    TaskSourceFields,
)
from trivium.config.schema_explorer import (  # noqa: F401 (re-exported)
    DynamicTimeoutConfig,
    EvalConfig,
    ExplorerConfig,
    OverRolloutConfig,
    RolloutConfig,
)
from trivium.config.schema_run import (  # noqa: F401 (re-exported)
    ActorResources,
    ClusterConfig,
    FaultsConfig,
    MonitorConfig,
    RuntimeConfig,
)

MAX_LR = 1.0  # AdamW's step is about lr per weight: above 1 no model survives a step
AdamBeta = Annotated[float, Field(ge=0.0, lt=1.0)]


class TinyModelConfig(StrictModel):
    """Recipe for a tiny model created at ``model.path`` when that folder does not exist yet."""

    corpus: list[str] = Field(default_factory=list)
    """JSON/JSONL files whose string fields train the tokenizer (relative to the config file's folder)."""
    vocab_size: int = Field(384, ge=261, le=COUNT_MAX)
    """BPE vocabulary size: 256 byte tokens + 5 special tokens + learned merges."""
    hidden_size: int = Field(128, ge=8, le=65536)
    """Width of the transformer."""
    num_layers: int = Field(4, ge=1, le=1024)
    """Number of decoder layers."""
    num_heads: int = Field(4, ge=1, le=1024)
    """Attention heads; must divide hidden_size."""
    num_kv_heads: int = Field(2, ge=1, le=1024)
    """Key/value heads (grouped-query attention); must divide num_heads."""
    intermediate_size: int = Field(512, ge=8, le=COUNT_MAX)
    """MLP width."""
    architecture: Literal["qwen2", "llama", "qwen2_vl"] = "qwen2"
    """transformers architecture to instantiate; qwen2_vl: a vision-language model (a 2-layer vision tower,
    an image processor for 56x56 to image_size x image_size pixels; docs/vision.md)."""
    image_size: int = Field(112, ge=56, le=1792, multiple_of=28)
    """qwen2_vl: the side of the largest image the processor keeps (larger ones are scaled down to
    image_size**2 pixels); a 28 x 28 square is one visual token."""
    seed: int = Field(0, ge=0, le=SEED_MAX)
    """Seed for the weights; the same seed and corpus give byte-identical files."""


class LoraConfig(StrictModel):
    """LoRA adapters (through peft): only they train; see docs/scale.md."""

    rank: int = Field(16, ge=1, le=4096)
    """r: the adapters' inner dimension. 8-64 is common; more adapts more, costs more."""
    alpha: float = Field(32.0, gt=0)
    """Scaling numerator: an adapter adds (alpha / rank) * B @ A to its weight."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input while training (SFT); RL stages train in eval mode, without it."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Names of the layers that get adapters (e.g. [q_proj, v_proj]), or all-linear (every linear layer
    but the output head). A name that matches no layer is an error when the model loads."""


class ModelConfig(StrictModel):
    path: str = ""
    """Local folder with a Hugging Face causal LM and tokenizer (or a hub id when online)."""
    tiny: TinyModelConfig | None = None
    """If set and ``path`` does not exist, create a tiny model there first (tests, teaching, CPU runs)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the trained weights. float32 is exact on CPU; bfloat16 halves memory on GPUs."""
    device: str = "auto"
    """'auto' (cuda when available, else cpu), 'cpu', 'cuda' or 'cuda:N'. With several trainer ranks on
    CUDA, rank r uses cuda:r."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (None: full fine-tuning)."""
    freeze_vision: bool = False
    """A vision-language model: keep its vision tower's weights as loaded (only the language model and the
    projector train). Refused for a text model."""


class TaskSetConfig(TaskSourceFields):
    path: str = ""
    """A JSON, JSONL or Parquet file or a folder of them, a CSV file, a datasets.save_to_disk folder, or a
    Hugging Face dataset id (relative to the config file's folder; docs/data.md). Dataset loading scripts
    (.py) are refused: the installed datasets library no longer runs them."""
    name: str = ""
    """Name used in task ids, metrics and errors; defaults to the file stem."""
    fields: dict[str, str] = Field(default_factory=dict)
    """Map from the workflow's field name to the column in the file, e.g. {question: problem}."""
    workflow: str = "math"
    """Registered workflow that runs each task."""
    workflow_args: dict[str, Any] = Field(default_factory=dict)
    """Extra arguments for the workflow (e.g. prompt_template, system_prompt)."""
    reward_fn: str = "math_verify"
    """Registered reward function (docs/rewards.md), or your own as module:function."""
    reward_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the reward function (e.g. pattern for format); checked by check-config."""
    reward_timeout_s: float = Field(30.0, ge=0, le=SECONDS_MAX)
    """A reward call still running after this many seconds scores 0 (counted in count/reward_timeout);
    0 = no limit. A reward that raises scores 0 too (count/reward_error); neither fails the task."""
    repeat_times: int = Field(8, ge=1, le=10_000)
    """Responses sampled per task (the GRPO group size)."""
    shuffle: bool = True
    """Shuffle the rows every epoch (seeded: the order depends only on the seed and the epoch)."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A row with a missing, mistyped or empty field: stop with an error naming it, or skip and count it."""
    on_long_row: Literal["skip", "truncate", "error"] = "skip"
    """A row whose prompt fills the model's context (known once rendered and tokenised, at run time):
    skip it and count it (rollout/skipped_long_tasks, eval/<set>/skipped_long_tasks), truncate its oldest
    tokens so the response keeps room (counted in .../truncated_prompts), or stop the run naming the row.
    Only its own task is affected, never the others of its batch."""
    max_rows: int | None = Field(None, ge=1, le=STEPS_MAX)
    """Use only the first N rows (quick runs)."""


class SftDatasetConfig(HubSourceFields):
    path: str = ""
    """Demonstrations: a JSON, JSONL or Parquet file or a folder of them, a CSV file, a
    datasets.save_to_disk folder, or a Hugging Face dataset id (relative to the config file's folder),
    read like a task set's path (docs/data.md)."""
    format: Literal["prompt_response", "messages"] = "prompt_response"
    """prompt_response: a user prompt and an assistant response per row; messages: a chat 'messages' list
    (multi-turn; every assistant turn is trained on)."""
    fields: dict[str, str] = Field(default_factory=dict)
    """Map from 'prompt'/'response' (or 'messages') to the columns in the file, e.g. {prompt: question}."""
    system_prompt: str | None = None
    """Optional system message put before every prompt."""
    shuffle: bool = True
    """Shuffle every epoch (seeded)."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A row with a missing, mistyped or empty field: stop with an error naming it, or skip and count it."""
    max_rows: int | None = Field(None, ge=1, le=STEPS_MAX)
    """Use only the first N rows."""


class PreferenceDatasetConfig(HubSourceFields):
    path: str = ""
    """Preference pairs: a JSON, JSONL or Parquet file or a folder of them, a CSV file, a
    datasets.save_to_disk folder, or a Hugging Face dataset id (relative to the config file's folder),
    read like a task set's path (docs/data.md)."""
    fields: dict[str, str] = Field(default_factory=dict)
    """Map from 'prompt'/'chosen'/'rejected' to the columns in the file."""
    system_prompt: str | None = None
    """Optional system message put before every prompt."""
    shuffle: bool = True
    """Shuffle every epoch (seeded)."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A row with a missing, mistyped or empty field: stop with an error naming it, or skip and count it."""
    max_rows: int | None = Field(None, ge=1, le=STEPS_MAX)
    """Use only the first N rows."""


class ReplayConfig(StrictModel):
    version_weight: float = 1.0
    """Priority gained per model version of an experience (newer first)."""
    use_weight: float = 1.0
    """Priority lost per time an experience was trained on."""
    cooldown_steps: int = Field(0, ge=0, le=STEPS_MAX)
    """Steps before a trained experience may be served again."""
    max_uses: int | None = Field(None, ge=1, le=STEPS_MAX)
    """Times an experience may be trained on; None = no limit."""


class StorageConfig(StrictModel):
    backend: Literal["sql", "jsonl"] = "sql"
    """sql: SQLite or PostgreSQL through SQLAlchemy (every feature: replay, serve mode's delayed rewards,
    several trainers sharing one queue); jsonl: one append-only JSONL file that other tools can read (fifo
    only, one reader per consumer name)."""
    url: str = ""
    """sql: a SQLite file path or SQLAlchemy URL (postgresql+psycopg2://user:pw@host/db); jsonl: the file
    path. Empty = buffer.sqlite / buffer.jsonl in the run folder."""
    table: str = "experiences"
    """Table name, so that several buffers can share one database."""
    policy: Literal["fifo", "replay"] = "fifo"
    """fifo: every experience trained exactly once, in order; replay: by priority (see replay)."""
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    """Priority replay settings (policy replay)."""
    read_timeout_s: float = Field(600.0, gt=0, le=SECONDS_MAX)
    """The trainer gives up when no batch arrives for this long (is the explore process running?)."""


class BufferConfig(BufferDataFields):
    batch_size: int = Field(16, ge=1, le=COUNT_MAX)
    """Tasks per explore step (online modes) or examples per train step (train mode)."""
    total_steps: int | None = Field(None, ge=1, le=STEPS_MAX)
    """Steps to run; if unset, total_epochs passes over the training data decide."""
    total_epochs: int = Field(1, ge=1, le=COUNT_MAX)
    """Passes over the task set / dataset when total_steps is unset."""
    taskset: TaskSetConfig | None = None
    """Tasks the explorer learns from (modes that explore)."""
    tasksets: list[TaskSetConfig] = Field(default_factory=list)
    """Several task sets mixed by their weight, instead of taskset (docs/data.md); same repeat_times."""
    eval_tasksets: list[TaskSetConfig] = Field(default_factory=list)
    """Task sets evaluated every explorer.eval_interval steps."""
    sft_dataset: SftDatasetConfig | None = None
    """Demonstrations for SFT in train mode."""
    preference_dataset: PreferenceDatasetConfig | None = None
    """Preference pairs for DPO in train mode."""
    expert_dataset: SftDatasetConfig | None = None
    """Expert demonstrations mixed into RL batches (CHORD, algorithm_type mix_chord)."""
    expert_per_step: int = Field(0, ge=0, le=COUNT_MAX)
    """Expert sequences added to every RL train batch from expert_dataset (e.g. 20% of the batch)."""
    storage: StorageConfig | None = None
    """Persistent experience buffer shared by separate explore and train processes."""
    queue_capacity: int = Field(0, ge=0, le=STEPS_MAX)
    """Experiences the in-process queue holds before the explorer blocks; 0 = two train batches."""


class KLLossConfig(StrictModel):
    coef: float = Field(0.0, ge=0.0)
    """β of the KL loss term; 0 turns it off (and no reference model is loaded)."""
    estimator: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "k3"
    """KL estimator (docs/algorithms.md §2.1)."""


class KLPenaltyConfig(StrictModel):
    coef: float = Field(0.0, ge=0.0)
    """β of the KL penalty folded into token rewards (PPO, RLOO, REINFORCE++); 0 turns it off."""
    estimator: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "k1"
    """KL estimator for the penalty (docs/algorithms.md §2.1a)."""
    adaptive: bool = False
    """Adapt β towards target_kl (Ziegler et al.)."""
    target_kl: float = Field(0.1, gt=0.0)
    """KL the adaptive controller aims for."""
    horizon: int = Field(10000, ge=1, le=STEPS_MAX)
    """Horizon of the adaptive controller, in sequences."""


class CriticConfig(StrictModel):
    path: str | None = None
    """Base model of the critic (a value head is added); None = the policy's starting weights."""
    lr: float = Field(1e-4, gt=0.0, le=MAX_LR)
    """Critic learning rate (its own AdamW; at most 1, as trainer.lr)."""
    value_clip: float = Field(0.5, ge=0.0)
    """ε_V of the clipped value loss."""
    warmup_steps: int = Field(0, ge=0, le=STEPS_MAX)
    """Steps during which only the critic trains (the policy waits for useful values)."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """GAE discount γ."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """GAE λ."""


class DynamicSamplingConfig(StrictModel):
    enabled: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more tasks to refill."""
    max_rounds: int = Field(10, ge=0, le=COUNT_MAX)
    """Give up with an error after this many extra sampling rounds in one step (0 = unlimited)."""


class OverlongPenaltyConfig(StrictModel):
    enabled: bool = False
    """DAPO overlong reward shaping, added to the task reward."""
    cache_length: int = Field(4, ge=1, le=COUNT_MAX)
    """L_cache: the penalty ramps from 0 to -factor over the last cache_length tokens before max_tokens."""
    factor: float = Field(1.0, ge=0.0)
    """Scale of the penalty."""


class DpoConfig(StrictModel):
    beta: float = Field(0.1, gt=0.0)
    """β of the DPO loss (strength of the implicit KL to the reference)."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """ε_ls of conservative DPO; 0 = plain DPO."""


class AlgorithmConfig(StrictModel):
    algorithm_type: str = "grpo"
    """Preset naming the parts below (see `trivium.algorithm.presets`: grpo, ppo, sft, dpo, rloo, ...)."""
    advantage_fn: str | None = None
    """Override the preset's advantage function (registered name or 'module:function')."""
    advantage_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments merged over the preset's advantage arguments."""
    policy_loss_fn: str | None = None
    """Override the preset's policy loss (registered name or 'module:function')."""
    policy_loss_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments merged over the preset's policy-loss arguments (e.g. clip_low, clip_high)."""
    loss_agg_mode: str | None = None
    """Override the preset's aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    kl_loss: KLLossConfig = Field(default_factory=KLLossConfig)
    """KL-to-reference loss term."""
    kl_penalty: KLPenaltyConfig = Field(default_factory=KLPenaltyConfig)
    """KL-to-reference penalty in the rewards."""
    rollout_is_cap: float | None = Field(None, ge=0.0)
    """Truncated importance sampling for samples drawn by older or mismatched rollout weights: advantages
    are scaled per token by min(π_trainer / π_rollout, cap). 0 = off; 2 is common. Use it off-policy. None
    (the default): 2 where the rollout engine samples with weights in another dtype than the trainer's
    (explorer.rollout.dtype, autocast_dtype: e.g. bf16 rollouts of a float32 policy), off otherwise; the
    run log says which. With one update per batch it costs no extra forward pass."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """c_H of the entropy bonus (docs/algorithms.md §2.2); 0 turns it off (and saves a [R, L, V] pass)."""
    teacher: str = "teacher"
    """Name of the auxiliary model that scores sampled tokens (on_policy_distill, jsd)."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The value model of PPO."""
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    """DAPO dynamic sampling."""
    overlong_penalty: OverlongPenaltyConfig = Field(default_factory=OverlongPenaltyConfig)
    """DAPO overlong reward shaping."""
    dpo: DpoConfig = Field(default_factory=DpoConfig)
    """DPO loss settings."""
    sample_strategy: str | None = None
    """Override the preset's sample strategy: default (rollouts only) or mix (rollouts + expert data)."""
    sample_strategy_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the sample strategy (e.g. expert_per_step for mix)."""


class TrainerConfig(StrictModel):
    strategy: Literal["single", "ddp", "fsdp2"] = "single"
    """single: one process; ddp: a full replica per rank, gradients summed; fsdp2: parameters, gradients
    and optimizer state sharded over ranks (fully_shard per decoder layer). See docs/scale.md."""
    world_size: int = Field(1, ge=1, le=1024)
    """Trainer ranks (processes) that `trivium run` starts on this machine for ddp or fsdp2: one per GPU on
    CUDA, one per group of cores on CPU. The explorer stays one process (rank 0's)."""
    lr: float = Field(1e-4, gt=0.0, le=MAX_LR)
    """Peak AdamW learning rate (at most 1: AdamW moves each weight by about lr a step, so a larger one only
    wrecks the model)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    betas: tuple[AdamBeta, AdamBeta] = (0.9, 0.999)
    """AdamW betas, each in [0, 1) (torch refuses others)."""
    optimizer_impl: Literal["auto", "fused", "foreach", "for_loop"] = "auto"
    """How torch's AdamW runs its update (the same update up to rounding; the checkpoint format is the
    same). fused: one kernel over all parameters (4.4x faster than for_loop on a 25M model on CPU,
    benchmarks/optimizer.py); foreach: per-op over lists (faster on CUDA, slower on CPU); for_loop: one
    parameter at a time. auto: fused where torch has it for the parameters' device (CPU, CUDA), else
    for_loop. The critic's AdamW takes the same."""
    optimizer_state_dtype: Literal["float32", "bfloat16"] = "float32"
    """AdamW's two moments in float32 (8 bytes a trainable parameter) or bfloat16 (4 bytes, stochastically
    rounded so that small updates of the second moment are not lost; trainer/adamw_bf16.py): half the
    optimizer state for a slower update. Weights stay float32; needs optimizer_impl auto."""
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: int = Field(0, ge=0, le=STEPS_MAX)
    """Linear warm-up steps (optimizer steps)."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Final learning rate of the cosine/linear schedule, as a fraction of lr."""
    grad_clip: float = Field(1.0, ge=0.0)
    """Clip the global gradient norm to this; 0 turns clipping off."""
    ppo_epochs: int = Field(1, ge=1, le=10_000)
    """Passes over each batch."""
    mini_batch_size: int = Field(0, ge=0, le=COUNT_MAX)
    """Experiences per optimizer step; 0 = the whole batch (one update per batch and epoch)."""
    micro_batch_size: int = Field(32, ge=1, le=COUNT_MAX)
    """Rows per forward/backward pass; the loss does not depend on it (global denominators)."""
    pack_length: int | None = Field(None, ge=1, le=COUNT_MAX)
    """Pack sequences into rows of this many tokens instead of padding each to the longest."""
    max_tokens_per_micro_batch: int = Field(4096, ge=0, le=COUNT_MAX)
    """Token budget of a forward/backward pass: a micro-batch takes at most this many tokens (rows x padded
    row length) and at most micro_batch_size rows, the rows spread evenly over the passes; 0 = rows alone
    (micro_batch_size). Long rows then run in small micro-batches and short ones in large, at a flat
    memory peak. Activation memory grows with it, speed barely (docs/performance.md); raise it on GPUs
    with memory to spare."""
    share_prompts: bool | Literal["auto"] = "auto"
    """Train the samples of a prompt as one row, the prompt once (each response attending to the prompt and to
    itself): the same log-probs and gradient, the prompt's forward and backward once a row instead of once a
    sample (0.48x the train pass at 896-token prompts, 128-token responses, 4 samples; trainer/layout.py).
    auto: a step takes it when its rows' tokens come to at most 60% of one row a sample (metric
    train/shared_row_tokens); true: always; false: never. A row holds as many samples as fit in
    max_tokens_per_micro_batch, two at least. Not with pack_length, images, or attention other than sdpa in
    a model that reads the batch (true with one of those is an error; auto stays off)."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Mixed precision of the trainer's passes (fp32 master weights and optimizer state always): bf16 or
    fp16 autocast (fp16 with loss scaling, CUDA only), or fp32. auto: bf16 on CUDA with bf16 and on CPUs
    with AVX-512-BF16 or AMX, else fp32; check-config prints the choice and why. docs/performance.md."""
    head_grad_precision: Literal["fp32", "autocast"] = "fp32"
    """The vocabulary head's two gradient products (for the hidden states and for the head's weight) under
    bf16/fp16 precision: fp32 (float32 products, as the head's forward), or autocast (in the autocast dtype,
    as every other layer's backward; the logits, log-sum-exp and log-probs stay float32). autocast takes the
    head's forward and backward 6.3 -> 4.5 s at 1,500 loss tokens x a 151,936-token vocabulary on an AMX
    CPU, the gradients 0.3% from the float32 products': a lever for large vocabularies; off by default,
    since it changes a run's numerics (docs/performance.md). No effect in fp32 or without the chunked head."""
    compile: bool = False
    """torch.compile each decoder layer of the training model in place (checkpoints unchanged; the first
    passes with and without gradients pay the compile, about a minute for a 25M model on 2 CPU cores).
    Not applied under bf16's emulation on CPUs without bf16 instructions. benchmarks/compile.py measures
    it; docs/performance.md has the figures."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (policy,
    PPO's critic, DPO's policy): a micro-batch keeps the layer's input and attention's output a token and
    layer instead of ~9h + 4i values, for about one more forward of the layers a step. The lever for sequences too long to
    train even one to a micro-batch; below that a smaller max_tokens_per_micro_batch costs less.
    trivium doctor sizes it and suggests it where nothing else fits (trainer/recompute.py)."""
    max_abs_reward: float = Field(1e6, gt=0)
    """Experiences whose reward is non-finite or larger than this in magnitude are dropped before training
    (counted in train/dropped_experiences): one absurd reward must not poison the weights."""
    skip_grad_norm: float = Field(1e6, gt=0)
    """An optimizer update whose gradient norm (before clipping) is non-finite or above this is not made
    (train/skipped_updates); the weights stay the last good ones."""
    max_bad_steps: int = Field(3, ge=1, le=STEPS_MAX)
    """Stop the run after this many train steps in a row with skipped updates or dropped-to-nothing batches
    (the newest checkpoint holds the last good weights)."""
    save_interval: int = Field(0, ge=0, le=STEPS_MAX)
    """Save a checkpoint every this many steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: int = Field(2, ge=1, le=10_000)
    """Most recent step checkpoints kept on disk."""


class SynchronizerConfig(StrictModel):
    method: str = "memory"
    """How new weights reach the rollout model (docs/sync.md). memory: in-process copy with a version
    number; checkpoint: versioned safetensors in checkpoint_dir; collective: torch.distributed broadcast
    from the train process to the explore process (both started with the same config); or a method of
    your own ('module:Class' or a name registered in SYNC_METHODS by a plugin)."""
    verify_checksum: bool = True
    """After every in-memory sync, compare a checksum of the trainer's and the rollout model's weights (a
    mismatch is an error). Costs a hash of the weights on each side per sync."""
    collective_init: str = "tcp://127.0.0.1:29517"
    """Rendezvous address of the collective method (the train process listens on it)."""
    collective_backend: Literal["gloo", "nccl"] = "gloo"
    """gloo on CPU; nccl when both processes hold the weights on CUDA devices."""
    checkpoint_dir: str = ""
    """Folder of published weight versions (method checkpoint); empty = sync/ in the run folder."""
    wait_timeout_s: float = Field(600.0, gt=0, le=SECONDS_MAX)
    """An explore process gives up when the weights it must wait for do not arrive within this time."""
    sync_interval: int = Field(1, ge=1, le=STEPS_MAX)
    """Trainer steps between weight syncs (1 = strictly on-policy)."""
    sync_offset: int = Field(0, ge=0, le=COUNT_MAX)
    """Explore steps the explorer may run ahead of the trainer (0 = alternate; > 0 = overlap in a thread)."""
    max_staleness: int | None = Field(None, ge=0, le=STEPS_MAX)
    """Experiences sampled by weights more than this many versions old are dropped or kept (staleness_policy)."""
    staleness_policy: Literal["drop", "keep"] = "drop"
    """What to do with experiences over max_staleness: drop them, or keep them (counted in the metrics)."""


class AuxiliaryModelConfig(StrictModel):
    name: str = "teacher"
    """Name the algorithm refers to (e.g. algorithm.teacher)."""
    path: str = ""
    """Local Hugging Face folder (or hub id); must share the policy's tokenizer to score its tokens."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the frozen weights."""


class BenchConfig(StrictModel):
    checkpoints: Literal["all", "latest", "none"] = "all"
    """Which step_N checkpoints to evaluate in mode bench."""
    checkpoint_dir: str | None = None
    """Folder searched for step_N/model checkpoints; default: this run folder's checkpoints."""
    include_base: bool = True
    """Evaluate model.path too (the starting point)."""


class ServeConfig(StrictModel):
    """Mode serve: the OpenAI-compatible endpoint over the current policy (see docs/serve.md)."""

    host: str = "127.0.0.1"
    """Interface to listen on; 0.0.0.0 serves other machines (api_key_env is required then)."""
    port: int = Field(0, ge=0, le=65535)
    """Port; 0 = a free one. The chosen URL is written to serve.json in the run folder."""
    api_key_env: str = ""
    """Name of an environment variable holding the API key that every /v1 and /feedback request must
    send (Authorization: Bearer KEY); empty = no key. A variable, so the key stays out of the run folder's
    resolved config."""
    model_name: str = ""
    """Model name in responses and /v1/models; empty = the run name."""
    poll_interval_s: float = Field(5.0, ge=0.01, le=SECONDS_MAX)
    """Seconds between looks for a newer weights version published by the train process."""
    keep_calls: int = Field(1000, ge=1, le=COUNT_MAX)
    """Calls kept in memory so that a chat continuing an earlier one reuses its sampled token ids; the
    oldest are dropped after this many (every call is in the buffer already)."""
    max_body_bytes: int = Field(4 << 20, ge=1024, le=1 << 30)
    """Largest request body accepted (413 beyond), checked while it is read, before it is parsed."""
    max_json_depth: int = Field(64, ge=4, le=1000)
    """Deepest JSON nesting of a request body (e.g. tool schemas); 400 beyond, checked before parsing."""
    body_timeout_s: float = Field(30.0, gt=0, le=SECONDS_MAX)
    """A request body must arrive within this many seconds (408 otherwise): slow senders hold no worker."""
    max_n: int = Field(128, ge=1, le=COUNT_MAX)
    """Most choices (n) one request may ask for (400 beyond)."""
    split_n: int = Field(8, ge=1, le=COUNT_MAX)
    """Samples generated per turn: a request for more is split, and its turns alternate with other requests'
    in one FIFO line, so one big request cannot hold the engine while small ones wait."""
    max_tokens: int | None = Field(None, ge=1, le=COUNT_MAX)
    """Cap on a request's max_tokens (a larger one is lowered to it); None: the model's context."""
    max_concurrent: int = Field(64, ge=1, le=100_000)
    """Turns generating at once (merged into one engine batch); more wait in line."""
    queue_timeout_s: float = Field(60.0, gt=0, le=SECONDS_MAX)
    """A turn waiting longer than this in line is answered 503 (Retry-After) instead."""
    request_timeout_s: float = Field(600.0, gt=0, le=SECONDS_MAX)
    """A request still generating after this long stops at its next turn (504); a turn is never cut."""
    reward_min: float = -1e6
    """Smallest reward POST /feedback accepts (400 below): one absurd reward would swamp a batch."""
    reward_max: float = 1e6
    """Largest reward POST /feedback accepts (400 above)."""


class TriviumConfig(StrictModel):
    project: str = "trivium"
    """Project folder under checkpoint_root."""
    name: str = "run"
    """Run name; the run folder is {checkpoint_root}/{project}/{name}."""
    checkpoint_root: str = "runs"
    """Root of run folders, relative to the working directory."""
    mode: Literal["both", "explore", "train", "bench", "serve"] = "both"
    """both: explorer + trainer (online RL); explore: explorer only, writing buffer.storage; train: trainer
    only, from a dataset (SFT, DPO) or from buffer.storage (online algorithms); bench: evaluate the base
    model and checkpoints on the eval task sets; serve: answer live traffic, record it into buffer.storage
    and reward it later by POST /feedback, following the weights a train process publishes."""
    seed: int = Field(0, ge=0, le=SEED_MAX)
    """Seed for Python, torch and data order (numpy and vLLM take at most 2**32 - 1)."""
    plugins: list[str] = Field(default_factory=list, max_length=256)
    """Your Python modules, imported before the config is checked, e.g. [my_parts, my_pkg.rewards]: the
    workflows, rewards, environments, tools, agents and algorithm parts they register can then be named
    here like built-in ones (any part can also be named 'module:attr' without registering it). Found in
    the config file's folder, the working directory, or PYTHONPATH. Importing runs their code: only list
    modules you trust (docs/plugins.md)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model."""
    auxiliary_models: list[AuxiliaryModelConfig] = Field(default_factory=list)
    """Frozen helper models, e.g. a teacher for distillation."""
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    """Rollout and evaluation."""
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    """Task sets, datasets and the experience queue."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """The learning algorithm and its parts."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Optimisation and checkpoints."""
    synchronizer: SynchronizerConfig = Field(default_factory=SynchronizerConfig)
    """Weight synchronisation from trainer to explorer."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Metrics and progress display."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """CPU threads of this process (run-level: stages cannot change it)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Where engines and trainer ranks run: this machine's processes, or a Ray cluster (run-level)."""
    bench: BenchConfig = Field(default_factory=BenchConfig)
    """What mode bench evaluates."""
    serve: ServeConfig = Field(default_factory=ServeConfig)
    """The endpoint of mode serve."""
    faults: FaultsConfig = Field(default_factory=FaultsConfig)
    """Fault injection for robustness tests (off)."""
    stages: list[dict[str, Any]] = Field(default_factory=list)
    """Stages run in order, each from the previous stage's final weights. Each entry has a 'name' and
    any top-level sections to override (mode, buffer, algorithm, trainer, ...)."""
