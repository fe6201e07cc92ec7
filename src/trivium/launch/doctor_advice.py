"""What ``trivium doctor`` suggests for a stage: the micro-batch that fits the memory there is, the precision
the hardware runs best, and, where no micro-batch fits, what else would (rollout dtype, gradient checkpointing,
bf16 optimizer moments, LoRA, FSDP2).

The memory budget is ``trivium doctor --memory SIZE`` (plan for another machine: ``80GiB``, ``24G``), else
the trainer's device: a CUDA device's total memory, or on a CPU what the machine has available now
(``MemAvailable`` of ``/proc/meminfo``). A plan fits when its estimated peak (``memory_estimate.py``) is at
most ``FILL`` of the budget: the estimate came within 0.94-1.12x of the measured peak at every rung of
``benchmarks/ladder.py`` (docs/performance.md), and the process's libraries come on top of its tensors.

What is suggested, and what is not:

- ``trainer.micro_batch_size``: only *down*, to the most rows a pass whose estimate fits, when the configured
  pass does not. Larger micro-batches are not suggested for speed: on CPU they were slower
  (``benchmarks/micro_batch.py``: 64 rows a pass 15.3 s a step, 8 rows 9.4 s); the update is the same.
- ``trainer.precision: auto`` where it is ``fp32`` and the device multiplies bf16 natively: auto times the
  model's pass at start and takes bf16 only where it pays.
- ``trainer.compile: true`` where the stage trains a model of at least ``COMPILE_MIN_PARAMS`` parameters in
  bf16 on a CPU that multiplies bf16 natively for at least ``COMPILE_WORTH_STEPS`` steps: there the step is
  bound by the elementwise work between the products, which the compiled layers fuse (``benchmarks/compile.py``
  on an AMX CPU: the bf16 train step 0.75x at 25M and 0.89x at 100M parameters, the ~1 min compile paid back
  after 61 and 29 steps). Not suggested on CUDA nor in fp32, where it is not measured to pay, nor for smaller
  models (the quickstart's 1M model: 0.93x a step, paid back after 449 steps) or shorter runs (tests, smoke
  runs), where the compile would not pay.
- ``trainer.head_grad_precision: autocast`` where the stage trains in bf16 on a CPU that multiplies bf16
  natively through the chunked vocabulary head at a vocabulary of at least ``HEAD_LOW_MIN_VOCAB`` tokens:
  there the head's two float32 gradient products are a large share of the train phase (the 0.5B rung of
  ``benchmarks/ladder.py`` at 151,936 tokens: 0.53x -> 0.44x TRL's step on an AMX CPU). Not the default,
  since it changes the run's numerics (docs/performance.md); not suggested on CUDA, where it is not measured.
- ``runtime.keep_freed_memory: true`` where a stage trains a model of at least ``KEEP_FREED_MIN_PARAMS``
  parameters on a CPU of a Linux (glibc) machine: each step's large blocks were fresh pages from the kernel
  (the 0.5B train step 0.69-0.84x with it, at the same peak; no change at 1M and 25M). A run-level setting.
- Where even one row a pass does not fit, one lever at a time, each with the rows that then fit:
  ``explorer.max_concurrency`` (fewer tasks sampled at once: a smaller KV cache, when sampling is the larger
  part), ``explorer.rollout.dtype: bfloat16`` (the in-process engine's copy of the weights and its KV cache in
  half; an engine that samples from the trainer's float32 weights gets a bf16 copy of its own instead),
  ``trainer.gradient_checkpointing: true`` (each layer keeps its input and attention's output and
  recomputes the rest in the backward: about one more forward a step; the lever for a sequence too long for
  one row a pass),
  ``trainer.optimizer_state_dtype: bfloat16`` (AdamW's two moments in half; not with FSDP2, which shards them),
  ``model.lora`` (rank 16: the optimizer state and gradients of the adapters only), and on CUDA
  ``trainer.strategy: fsdp2`` over 2, 4 or 8 GPUs (weights, gradients and optimizer state sharded; on a CPU
  the ranks share one machine's memory, so it is not suggested there). If none fits, the doctor says so.
"""

from __future__ import annotations

import dataclasses
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trivium.launch.memory_estimate import Estimate, Shapes, mib
from trivium.validation.validate_layout import engine_dtype

__all__ = [
    "COMPILE_MIN_PARAMS",
    "COMPILE_WORTH_STEPS",
    "FILL",
    "HEAD_LOW_MIN_VOCAB",
    "KEEP_FREED_MIN_PARAMS",
    "SPEED_SETTINGS",
    "Advice",
    "Budget",
    "advise",
    "memory_budget",
    "parse_size",
]

FILL = 0.85
COMPILE_WORTH_STEPS = 200  # trainer.compile's suggestion: over three times the longest payback measured (61)
COMPILE_MIN_PARAMS = 20_000_000  # ... for models the size of those it was measured to pay for (25M, 100M)
KEEP_FREED_MIN_PARAMS = 400_000_000  # runtime.keep_freed_memory's suggestion: models near the 0.5B measured
HEAD_LOW_MIN_VOCAB = 100_000  # trainer.head_grad_precision's suggestion: vocabularies like the 152k measured
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Advice:
    setting: str | None  # the config field, e.g. "trainer.micro_batch_size"; None: nothing to set (a finding)
    value: Any
    why: str

    def line(self) -> str:
        return f"set {self.setting}: {self.value} ({self.why})" if self.setting else self.why


@dataclass(frozen=True)
class Budget:
    bytes: float
    source: str  # where the number comes from, in words


def parse_size(text: str) -> float:
    """Bytes of a size such as ``24GiB``, ``80G``, ``512MB`` or ``1.5T`` (powers of 1024 throughout)."""
    match = _SIZE.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"--memory {text!r} is not a size: write a positive number with a unit, e.g. 24GiB, 80G or 512MiB"
        )
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def memory_budget(device, memory: float | None = None) -> Budget | None:
    """The memory a run on ``device`` may use: ``memory`` (``--memory``) if given, the CUDA device's total,
    or this machine's available memory; None where it cannot be read."""
    if memory:
        return Budget(memory, "--memory")
    if device.type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        return Budget(float(props.total_memory), f"{props.name}'s memory")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Budget(float(line.split()[1]) * 1024, "this machine's available memory now")
    except (OSError, IndexError, ValueError):
        pass
    return None


def advise(
    cfg,
    shapes: Shapes,
    estimate_with: Callable[..., Estimate],
    budget: Budget | None,
    native_bf16: tuple[bool, str],
    lora_trainable: Callable[[], int],
    trains: bool,
    in_flight_at: Callable[[int], int] | None = None,
    steps: int = 0,
    precision: str | None = None,
    device_type: str = "cpu",
    params: int = 0,
    vocab: int = 0,
) -> list[Advice]:
    """The suggestions for one stage (module docstring). ``estimate_with(shapes, rollout_dtype=..., shards=...)``
    re-estimates the stage with its changes; ``lora_trainable()`` counts rank-16 adapters; ``in_flight_at(k)``:
    the sequences sampled at once with ``explorer.max_concurrency`` k (None: the stage samples nothing);
    ``steps``: the stage's training steps; ``precision``: what ``trainer.precision`` resolves to here;
    ``params``: the model's parameters; ``vocab``: its vocabulary."""
    out = []
    t = cfg.trainer
    bf16_cpu = trains and precision == "bf16" and device_type == "cpu" and native_bf16[0]
    if steps >= COMPILE_WORTH_STEPS and params >= COMPILE_MIN_PARAMS and bf16_cpu and not t.compile:
        out.append(
            Advice(
                "trainer.compile",
                "true",
                f"{steps} bf16 training steps of {params / 1e6:,.0f}M parameters on a CPU with bf16 "
                "instructions: the compiled decoder layers fuse "
                "the elementwise work that bounds the step there (benchmarks/compile.py on an AMX CPU: 0.75-0.89x "
                "a step, the ~1 min compile paid back within 30-60 steps)",
            )
        )
    if bf16_cpu and shapes.head_chunk and vocab >= HEAD_LOW_MIN_VOCAB and t.head_grad_precision == "fp32":
        out.append(
            Advice(
                "trainer.head_grad_precision",
                "autocast",
                f"bf16 training through a {vocab:,}-token vocabulary head on a CPU with bf16 instructions: its "
                "two gradient products in bf16 instead of float32 (benchmarks/ladder.py's 0.5B rung on an AMX "
                "CPU: 0.53x -> 0.44x TRL's step, gradients 0.3% from float32's; it changes the run's numerics, "
                "docs/performance.md)",
            )
        )
    if (
        trains
        and device_type == "cpu"
        and params >= KEEP_FREED_MIN_PARAMS
        and not cfg.runtime.keep_freed_memory
        and platform.libc_ver()[0] == "glibc"
    ):
        out.append(
            Advice(
                "runtime.keep_freed_memory",
                "true",
                f"training {params / 1e6:,.0f}M parameters on a CPU: each step's large blocks come back from the "
                "kernel as fresh pages; kept in the process, the 0.5B train step took 0.69-0.84x the time at the "
                "same peak (docs/performance.md)",
            )
        )
    if trains and t.precision == "fp32" and native_bf16[0]:
        out.append(
            Advice(
                "trainer.precision",
                "auto",
                f"{native_bf16[1]}; auto times the model's pass at start and trains in bf16 only where it is "
                "at least 1.2x as fast",
            )
        )
    if budget is None:
        return out
    limit = FILL * budget.bytes
    current = estimate_with(shapes).peak
    if current <= limit:
        return out
    over = (
        f"the estimated peak {mib(current)} at {shapes.rows_per_micro} row(s) a pass is more than "
        f"{FILL:.0%} of {mib(budget.bytes)} ({budget.source})"
    )
    if trains:
        fit = _most_rows(shapes, estimate_with, limit)
        if fit is not None:
            rows, peak = fit
            why = f"{over}; at {rows} row(s) it is {mib(peak)}, the same update in more passes"
            return [*out, Advice("trainer.micro_batch_size", rows, why)]
    levers: list[tuple[str, Any, Shapes, dict[str, Any], str]] = []
    current_tasks = cfg.explorer.max_concurrency or cfg.buffer.batch_size
    if shapes.rollout_engine and in_flight_at is not None and current_tasks > 1:
        for tasks in _halvings(current_tasks):
            fewer = dataclasses.replace(shapes, in_flight=in_flight_at(tasks))
            what = f"{tasks} tasks sampled at once ({fewer.in_flight} sequences in flight, from {shapes.in_flight})"
            levers.append(("explorer.max_concurrency", tasks, fewer, {}, what))
    if shapes.rollout_engine and engine_dtype(cfg) == "float32" and cfg.model.dtype == "float32":
        levers.append(
            (
                "explorer.rollout.dtype",
                "bfloat16",
                shapes,
                {"rollout_dtype": "bfloat16"},
                "the engine's KV cache in half, a bf16 copy of the weights"
                if shapes.rollout_shares_weights
                else "the engine's weights in half",
            )
        )
    if trains and not t.gradient_checkpointing:
        recomputed = dataclasses.replace(shapes, recompute=True)
        what = "each layer's activations recomputed in the backward: about one more forward a step"
        levers.append(("trainer.gradient_checkpointing", "true", recomputed, {}, what))
    if (
        trains
        and t.optimizer_state_dtype == "float32"
        and t.strategy != "fsdp2"
        and cfg.model.dtype == "float32"
    ):
        halved = dataclasses.replace(shapes, moment_bytes=2)
        what = "AdamW's moments in bf16: half the optimizer state, a slower update (benchmarks/optimizer.py)"
        levers.append(("trainer.optimizer_state_dtype", "bfloat16", halved, {}, what))
    if trains and cfg.model.lora is None:
        adapters = lora_trainable()
        lora_shapes = dataclasses.replace(shapes, trainable=adapters, frozen_copies=0)
        levers.append(("model.lora", "{rank: 16}", lora_shapes, {}, f"{adapters:,} trainable parameters"))
    if trains and t.strategy != "fsdp2" and str(cfg.model.device).startswith("cuda"):
        for gpus in (2, 4, 8):
            levers.append(
                (
                    "trainer.strategy",
                    "fsdp2",
                    shapes,
                    {"shards": gpus},
                    f"with trainer.world_size {gpus}, one GPU each",
                )
            )
    for setting, value, lever_shapes, changes, what in levers:
        if trains:
            fit = _most_rows(lever_shapes, lambda s, c=changes: estimate_with(s, **c), limit)
        else:
            peak = estimate_with(lever_shapes, **changes).peak
            fit = (lever_shapes.rows_per_micro, peak) if peak <= limit else None
        if fit is not None:
            rows, peak = fit
            fewer_rows = trains and rows < shapes.rows_per_micro
            tail = f" and {rows} row(s) a pass (below)" if fewer_rows else ""
            out.append(Advice(setting, value, f"{over}; {what}{tail}: {mib(peak)}"))
            if fewer_rows:
                out.append(Advice("trainer.micro_batch_size", rows, f"with {setting} {value} (above)"))
            return out
    smallest = estimate_with(dataclasses.replace(shapes, rows_per_micro=1))
    why = (
        f"nothing here fits: {over}; at 1 row a pass it is still {mib(smallest.peak)} (weights and optimizer "
        f"state {mib(smallest.steady)}, training {mib(smallest.train_transient)}, sampling "
        f"{mib(smallest.rollout_transient)}), and none of fewer tasks at once, bf16 rollouts, gradient "
        "checkpointing, bf16 optimizer moments, LoRA or FSDP2 alone "
        "brings it under: a machine with more memory, or a smaller model"
    )
    return [*out, Advice(None, None, why)]


# advice for speed, not memory
SPEED_SETTINGS = (
    "trainer.precision",
    "trainer.compile",
    "trainer.head_grad_precision",
    "runtime.keep_freed_memory",
)


def _halvings(n: int) -> list[int]:
    """n // 2, n // 4, ... down to 1: the settings tried for a count, largest first."""
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return out


def _most_rows(
    shapes: Shapes, estimate_with: Callable[..., Estimate], limit: float
) -> tuple[int, float] | None:
    """The most rows a pass (up to the configured) whose estimated peak is within ``limit``, and that peak."""
    for rows in range(shapes.rows_per_micro, 0, -1):
        peak = estimate_with(dataclasses.replace(shapes, rows_per_micro=rows)).peak
        if peak <= limit:
            return rows, peak
    return None
