"""TRL's GRPOTrainer as the benchmarks run it (``vs_trl.py``, ``ladder.py``): one config, a timed generate.

``grpo_config`` is GRPO as both sides run it: one update per batch (PPO-clip, no KL), constant lr, T = 1,
no top-k/top-p, no vLLM, on the CPU, nothing saved or reported. ``clock`` wraps the model's ``generate`` to
time it and count the tokens it made (up to and including the first EOS), and returns a callback that
prints one JSON line per step (``step``, ``step_s``, ``rollout_s``, ``tokens``, and what ``extra`` adds).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable


def grpo_config(
    *, steps: int, prompts: int, group: int, max_tokens: int, lr: float, bf16: bool, checkpointing: bool
):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"),
        seed=0,
        max_steps=steps,
        per_device_train_batch_size=prompts * group,
        gradient_accumulation_steps=1,
        num_generations=group,
        max_completion_length=max_tokens,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        loss_type="grpo",
        shuffle_dataset=False,
        use_vllm=False,
        use_cpu=True,
        bf16=bf16,
        gradient_checkpointing=checkpointing,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
    )


def clock(model, tokenizer, extra: Callable[[int], dict] | None = None):
    """Time ``model.generate`` from now on; the ``TrainerCallback`` that prints a line per step. The
    untimed ``generate`` is returned too (for an evaluation outside the step's rollout)."""
    from transformers import TrainerCallback

    gen = {"s": 0.0, "tokens": 0}
    plain_generate = model.generate
    eos = tokenizer.eos_token_id

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = plain_generate(*a, **kw)
        gen["s"] += time.perf_counter() - t0
        prompt_len = (kw.get("input_ids") if "input_ids" in kw else a[0]).shape[1]
        new = out[:, prompt_len:]
        done = (new == eos).cumsum(1)  # tokens up to and including the first EOS
        gen["tokens"] += int(((done == 0) | ((done == 1) & (new == eos))).sum())
        return out

    model.generate = timed_generate

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            gen["s"], gen["tokens"], self.t0 = 0.0, 0, time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            row = {
                "step": state.global_step,
                "step_s": time.perf_counter() - self.t0,
                "rollout_s": gen["s"],
                "tokens": gen["tokens"],
            }
            if extra is not None:
                more = extra(state.global_step)
                row["step_s"] += more.get("eval_s", 0.0)
                row.update(more)
            print(json.dumps(row), flush=True)

    return Clock(), plain_generate
