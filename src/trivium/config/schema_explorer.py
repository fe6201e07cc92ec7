"""The ``explorer`` section: how responses are sampled (rollout, evaluation), how many engines, and how a
step's tasks are run: concurrency, retries, time limits, and long-tail control (over-rollout, dynamic
timeouts; docs/agents.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trivium.config.schema_base import COUNT_MAX, SECONDS_MAX, STEPS_MAX, StrictModel


class RolloutConfig(StrictModel):
    engine_type: Literal["transformers", "vllm"] = "transformers"
    """Rollout engine. 'transformers': in-process decode loop over the HF model with a KV cache (exact,
    reproducible, no extra install). 'vllm': vLLM in its own engine process, weights updated in place after
    every sync; needs the vllm package (CPU: scripts/setup_vllm_cpu.sh). See docs/engines.md."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] | None = "auto"
    """Dtype of the rollout engine's weights. auto (the default): bfloat16 where the device multiplies bf16
    natively (a CPU with AVX-512-BF16 or AMX, a CUDA GPU of compute capability 8.0+), model.dtype is
    float32, trainer.precision is auto or bf16 and the engine is the transformers one (vLLM's bf16 learning
    is not measured: ask for bfloat16 there); the policy's dtype elsewhere (models/bf16.py). None: the
    policy's (model.dtype) everywhere. bfloat16 halves the engine's weights and its KV cache and samples
    1.5x (25M) to 2.0x (100M) faster than fp32 on an AVX-512-BF16 CPU (benchmarks/decode_step.py), but
    costs a bf16 copy of the weights where a float32 engine would sample from the trainer's own tensors;
    log-probs then differ from the trainer's by the bf16 error (logged as mismatch/* every step) and the
    trainer's rollout correction is on (algorithm.rollout_is_cap). The quickstart (three seeds) learns the same
    with it; the 25M workload (two seeds) within the 10-point bar, but lower in both (+67.2 against +73.4
    points mean gain, docs/performance.md)."""
    autocast_dtype: Literal["bfloat16", "float16"] | None = None
    """transformers engine only: keep the weights in ``dtype`` and run the forward under torch.autocast in
    this dtype (matmuls in bf16, the rest fp32); ``dtype`` auto then keeps the policy's weights. None: off."""
    in_flight_updates: bool = False
    """transformers engine only (partial rollouts): a weight sync does not wait for running generations;
    they load the new weights at the next token, prefill what they have so far again under them, and go
    on. Each token records the version that sampled it (staleness/token_*), its log-prob is that version's,
    and the trainer's rollout correction (algorithm.rollout_is_cap) weighs each token by it. Useful where
    generations run while the trainer syncs: mode both with synchronizer.sync_offset >= 1, decoupled
    processes, Ray engines."""
    vllm_kv_cache_gb: float | None = Field(None, gt=0, le=1e5)
    """vLLM only: KV cache size in GiB. None: 1 GiB on CPU (or VLLM_CPU_KVCACHE_SPACE), and on GPU the
    vllm_gpu_memory_utilization share."""
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vLLM on GPU only: share of the GPU's memory vLLM may take (weights + KV cache); the trainer shares the
    GPU in mode 'both', so this stays well below vLLM's own default of 0.9."""
    vllm_enforce_eager: bool | None = None
    """vLLM only: run without torch.compile / CUDA graphs. None: eager on CPU, compiled on GPU."""
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    """Sampling temperature; 0 means greedy. Trainer log-probs use the same temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; 1.0 turns it off."""
    top_k: int = Field(0, ge=0, le=COUNT_MAX)
    """Sample among the k most likely tokens; 0 turns it off."""
    max_tokens: int = Field(64, ge=1, le=COUNT_MAX)
    """Maximum generated tokens per response; also C of the seq-mean-token-sum-norm aggregation."""
    stop: list[str] = Field(default_factory=list)
    """Extra stop strings (EOS always stops)."""


class EvalConfig(StrictModel):
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    """Sampling temperature for evaluation; 0 = greedy."""
    repeat_times: int = Field(1, ge=1, le=10_000)
    """Samples per eval task; accuracy is averaged over them."""


class OverRolloutConfig(StrictModel):
    ratio: float = Field(1.0, ge=1.0, le=100.0)
    """Start ceil(ratio x batch_size) tasks a step and go ahead once batch_size of them finished with
    experiences; the rest are cancelled at their next model or environment call (dropped, counted in
    rollout/cancelled_tasks; a group is never trained half-finished). 1 = off. Going ahead with the first
    finished favours tasks that finish fast (short answers, quick environments): watch the response
    lengths, and give the slower ones time with wait_after_min."""
    wait_after_min: float = Field(0.0, ge=0, le=SECONDS_MAX)
    """Go ahead no sooner than this many seconds after the step's tasks started, even with batch_size
    finished; of all finished, the first batch_size in task order are trained (rollout/unused_groups counts
    the rest)."""


class DynamicTimeoutConfig(StrictModel):
    enable: bool = False
    """A task's time limit follows the run: ratio x the mean duration of the last window tasks that
    succeeded (once min_samples have), never above explorer.workflow_timeout_s when that is set; enforced
    at the task's next model call and around each environment call (a hung environment costs the limit,
    not its configured worst case). Evaluation tasks keep the fixed limit."""
    ratio: float = Field(3.0, ge=1.0, le=1e6)
    """The limit as a multiple of the mean successful task duration (>= 1)."""
    window: int = Field(64, ge=1, le=COUNT_MAX)
    """Successful tasks the mean is taken over (the most recent)."""
    min_samples: int = Field(8, ge=1, le=COUNT_MAX)
    """Successful tasks needed before the limit applies (until then: the fixed limit)."""


class ExplorerConfig(StrictModel):
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """How responses are sampled."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """How eval task sets are sampled."""
    eval_interval: int = Field(10, ge=0, le=STEPS_MAX)
    """Evaluate every this many steps (and always at the end); 0 = only at the start and the end."""
    engine_num: int = Field(1, ge=1, le=4096)
    """Rollout engines; each step's generation requests are spread over them. More than one needs
    cluster.backend: ray (each engine is a Ray actor with cluster.engine's resources)."""
    eval_at_start: bool = True
    """Evaluate the starting model before the first step (the baseline of the learning curve)."""
    max_concurrency: int = Field(0, ge=0, le=COUNT_MAX)
    """Workflow runs in flight at once; their model calls are batched together. 0 = one per task."""
    max_retries: int = Field(0, ge=0, le=1000)
    """Re-run a task whose workflow raised, up to this many more times (fresh workflow and environments)."""
    workflow_timeout_s: float = Field(0.0, ge=0, le=SECONDS_MAX)
    """A task still running after this many seconds fails at its next model call; 0 = no limit.
    Environment steps have their own limit (workflow_args.env_timeout_s of the multi-turn workflows)."""
    over_rollout: OverRolloutConfig = Field(default_factory=OverRolloutConfig)
    """More tasks than a step needs, and the step goes ahead without the slowest (named as in Trinity-RFT)."""
    dynamic_timeout: DynamicTimeoutConfig = Field(default_factory=DynamicTimeoutConfig)
    """Each task's limit from the run's own task durations (named as in Trinity-RFT, so configs port)."""
