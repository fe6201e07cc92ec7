"""`trivium doctor`'s advice: each suggestion, applied to the config, gives a plan the doctor says fits, and one
row a pass more would not; where nothing fits it says so; the precision it suggests follows the hardware."""

import dataclasses
import functools
from pathlib import Path
from types import SimpleNamespace

import pytest

from trivium.cli import main as cli
from trivium.launch.config_doctor import stage_facts
from trivium.launch.doctor_advice import FILL, Budget, advise, parse_size
from trivium.launch.memory_estimate import ModelShape, Shapes, estimate
from trivium.validation import load_config

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "grpo_word_problems.yaml"
MiB = 2**20


def grpo(memory: float, *overrides: str):
    """The quickstart's GRPO stage (stages.1) as the doctor sees it with ``memory`` bytes: (facts, its
    advice by setting, without the stage prefix); ``overrides`` are its own settings."""
    changes = [f"stages.1.{kv}" for kv in overrides]
    run_cfg = load_config(QUICKSTART, changes)
    facts = stage_facts(run_cfg.stages[1], 1, len(run_cfg.stages), memory)  # `explain`'s, for this stage only
    for a in facts.advice:  # what --set takes: the stage's own settings under stages.1, run-level ones bare
        assert not a.setting or a.setting.startswith("stages.1.") or a.setting.startswith("runtime."), a
    return facts, {a.setting.removeprefix("stages.1.") if a.setting else None: a.value for a in facts.advice}


def test_sizes_are_read_in_powers_of_1024_and_a_bad_one_is_named():
    assert parse_size("24GiB") == parse_size("24G") == parse_size("24 gb") == 24 * 2**30
    assert (
        parse_size("512MiB") == 512 * MiB and parse_size("1.5T") == 1.5 * 2**40 and parse_size("4096") == 4096
    )
    for bad in ("lots", "-1G", "0", "12 parsecs"):
        with pytest.raises(ValueError, match="--memory"):
            parse_size(bad)


def test_a_lower_micro_batch_is_suggested_that_fits_where_one_more_row_would_not():
    full, advice = grpo(1e12)
    assert advice == {} and "advice       memory: fits" in "\n".join(full.lines)
    # a budget that the training pass overruns and sampling does not: fewer rows a pass is the fix
    limit = full.estimate.peak - 3 * MiB
    _, advice = grpo(limit / FILL)
    rows = advice["trainer.micro_batch_size"]
    assert list(advice) == ["trainer.micro_batch_size"] and 1 <= rows < full.shapes.rows_per_micro
    fixed, again = grpo(limit / FILL, f"trainer.micro_batch_size={rows}")
    assert again == {} and fixed.estimate.peak <= limit  # applied, the doctor has nothing more to say
    assert grpo(limit / FILL, f"trainer.micro_batch_size={rows + 1}")[0].estimate.peak > limit


def test_when_sampling_is_the_larger_part_fewer_tasks_at_once_are_suggested_with_the_rows_that_fit():
    _, advice = grpo(100 * MiB)
    assert set(advice) == {"explorer.max_concurrency", "trainer.micro_batch_size"}
    tasks, rows = advice["explorer.max_concurrency"], advice["trainer.micro_batch_size"]
    fixed, again = grpo(100 * MiB, f"explorer.max_concurrency={tasks}", f"trainer.micro_batch_size={rows}")
    assert again == {} and fixed.estimate.peak <= FILL * 100 * MiB
    # twice the tasks would not fit at any micro-batch: the largest count that fits was chosen
    doubled, _ = grpo(100 * MiB, f"explorer.max_concurrency={2 * tasks}", "trainer.micro_batch_size=1")
    assert doubled.estimate.peak > FILL * 100 * MiB


def test_where_nothing_fits_the_doctor_says_so_with_the_floor():
    facts, _ = grpo(40 * MiB)
    (finding,) = facts.advice
    assert (
        finding.setting is None and "nothing here fits" in finding.line() and "at 1 row a pass" in finding.why
    )


def test_fp32_on_hardware_with_native_bf16_gets_auto_suggested(monkeypatch):
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    assert grpo(1e12, "trainer.precision=fp32")[1] == {"trainer.precision": "auto"}
    assert grpo(1e12)[1] == {}  # auto already
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    assert grpo(1e12, "trainer.precision=fp32")[1] == {}


def test_long_bf16_runs_on_a_cpu_with_bf16_instructions_get_compile_suggested(monkeypatch):
    """Where it was measured to pay: a stage of at least COMPILE_WORTH_STEPS steps training a model of at
    least COMPILE_MIN_PARAMS parameters in bf16 on a CPU that multiplies bf16 natively; not for the
    quickstart's 1M model, short runs, fp32, emulated bf16, or a run that compiles already. A speed
    suggestion leaves the memory verdict in place."""
    import trivium.launch.doctor_advice as doctor_advice
    from trivium.launch.doctor_advice import COMPILE_WORTH_STEPS

    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    long, bf16 = f"buffer.total_steps={COMPILE_WORTH_STEPS}", "trainer.precision=bf16"
    assert grpo(1e12, long, bf16)[1] == {}  # the quickstart's 1M model: the compile would not pay
    monkeypatch.setattr(doctor_advice, "COMPILE_MIN_PARAMS", 1_000_000)  # as if the model were large enough
    facts, advice = grpo(1e12, long, bf16)
    assert advice == {"trainer.compile": "true"}
    assert "advice       memory: fits" in "\n".join(facts.lines)
    assert f"{COMPILE_WORTH_STEPS} bf16 training steps of 1M parameters" in facts.advice[0].why
    assert grpo(1e12, f"buffer.total_steps={COMPILE_WORTH_STEPS - 1}", bf16)[1] == {}
    assert grpo(1e12, long, bf16, "trainer.compile=true")[1] == {}
    assert grpo(1e12, long, "trainer.precision=fp32")[1] == {"trainer.precision": "auto"}
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    assert grpo(1e12, long, bf16)[1] == {}  # bf16 emulated: compile is not applied there


def test_bf16_runs_through_a_large_vocabulary_get_the_heads_bf16_products_suggested(monkeypatch):
    """Where it was measured to pay: bf16 training on a CPU that multiplies bf16 natively through the chunked
    head of a vocabulary of at least HEAD_LOW_MIN_VOCAB tokens; not below it (the quickstart's 384), in
    fp32, with emulated bf16, or where it is set already."""
    import trivium.launch.doctor_advice as doctor_advice

    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    bf16 = "trainer.precision=bf16"
    assert grpo(1e12, bf16)[1] == {}  # a 384-token vocabulary
    monkeypatch.setattr(doctor_advice, "HEAD_LOW_MIN_VOCAB", 384)  # as if the vocabulary were large
    facts, advice = grpo(1e12, bf16)
    assert advice == {"trainer.head_grad_precision": "autocast"}
    assert "384-token vocabulary head" in facts.advice[0].why
    assert "advice       memory: fits" in "\n".join(facts.lines)  # a speed suggestion
    assert grpo(1e12, bf16, "trainer.head_grad_precision=autocast")[1] == {}
    assert grpo(1e12, "trainer.precision=fp32")[1] == {"trainer.precision": "auto"}
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    assert grpo(1e12, bf16)[1] == {}  # bf16 emulated


def test_large_models_trained_on_a_cpu_get_keep_freed_memory_suggested_for_the_whole_run(monkeypatch):
    """At KEEP_FREED_MIN_PARAMS or more on a CPU (glibc): runtime.keep_freed_memory, a run-level setting,
    suggested as the run's (no stages.1. prefix, which a stage could not take); not below it, nor where it
    is set."""
    import platform

    import trivium.launch.doctor_advice as doctor_advice

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    assert grpo(1e12)[1] == {}  # the quickstart's 1M model
    monkeypatch.setattr(doctor_advice, "KEEP_FREED_MIN_PARAMS", 1_000_000)  # as if the model were large
    facts, advice = grpo(1e12)
    assert advice == {"runtime.keep_freed_memory": "true"}
    assert facts.advice[0].setting == "runtime.keep_freed_memory"
    assert "advice       memory: fits" in "\n".join(facts.lines)  # a speed suggestion
    run_cfg = load_config(QUICKSTART, ["runtime.keep_freed_memory=true"])  # what --set does with it
    assert stage_facts(run_cfg.stages[1], 1, len(run_cfg.stages), 1e12).advice == []


# The Qwen2.5-0.5B shape (benchmarks/ladder.py's largest rung), 8 rows of 1k tokens a pass, trained alone.
SHAPE = ModelShape(params=494_032_768, layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64,
                   intermediate=4864, vocab=151_936, tied=True)  # fmt: skip
SHAPES = Shapes(experiences=64, rows_per_micro=8, seq_len=1024, loss_tokens=512, in_flight=0, rollout_seq=0,
                trainable=SHAPE.params, frozen_copies=0, rollout_engine=False, head_chunk=256)  # fmt: skip


def stage(device="cpu", lora=None, recompute=False):
    return SimpleNamespace(
        trainer=SimpleNamespace(
            precision="auto",
            strategy="single",
            optimizer_state_dtype="float32",
            gradient_checkpointing=recompute,
        ),
        model=SimpleNamespace(device=device, dtype="float32", lora=lora),
        explorer=SimpleNamespace(max_concurrency=0, rollout=SimpleNamespace(dtype=None)),
        buffer=SimpleNamespace(batch_size=8),
    )


def with_changes(shapes, rollout_dtype=None, shards=1):
    return estimate(SHAPE, shapes, "float32", rollout_dtype or "float32", shards)


def lora_adapters():
    return 8_798_208  # rank 16 on every linear layer of the shape above


def test_rows_whose_activations_do_not_fit_even_one_a_pass_get_gradient_checkpointing_first():
    one_row = with_changes(dataclasses.replace(SHAPES, rows_per_micro=1))
    budget = Budget(one_row.peak * 0.9 / FILL, "a test")  # even one row a pass is over
    advice = advise(stage(), SHAPES, with_changes, budget, (False, ""), lora_adapters, True)
    assert advice[0].setting == "trainer.gradient_checkpointing" and advice[0].value == "true"
    recomputed = dataclasses.replace(SHAPES, recompute=True)
    rows = advice[1].value if len(advice) > 1 else SHAPES.rows_per_micro
    assert [a.setting for a in advice[1:]] == (["trainer.micro_batch_size"] if len(advice) > 1 else [])
    assert with_changes(dataclasses.replace(recomputed, rows_per_micro=rows)).peak <= FILL * budget.bytes
    if rows < SHAPES.rows_per_micro:
        assert (
            with_changes(dataclasses.replace(recomputed, rows_per_micro=rows + 1)).peak > FILL * budget.bytes
        )
    # a 1k-token row's layers keep their input, attention's output and log-sum-exp a token and one layer's
    # full set, against every layer's full set (9h + 2kv + 4i values a token); the head's part is the same
    act = with_changes(dataclasses.replace(recomputed, rows_per_micro=1)).parts["trainer"]["activations"]
    full, per_layer = one_row.parts["trainer"]["activations"], SHAPE.act_per_token_layer()
    kept = 2 * SHAPE.hidden + SHAPE.heads  # 14 heads x 64 = 896 = h here
    assert full - act == 1024 * ((SHAPE.layers - 1) * per_layer - SHAPE.layers * kept) * 4
    assert full / act > 3  # 2.5 GB less at this shape, the head's chunk and tied gradient 0.7 GB either way
    # already on: the doctor does not suggest it again, and goes on to the next lever
    again = advise(stage(recompute=True), recomputed, with_changes, budget, (False, ""), lora_adapters, True)
    assert "trainer.gradient_checkpointing" not in [a.setting for a in again]


def test_a_model_whose_optimizer_state_does_not_fit_gets_bf16_moments_then_lora_on_cpu_and_fsdp2_on_gpus():
    # with gradient checkpointing on already (the lever before these, above)
    shapes, on = dataclasses.replace(SHAPES, recompute=True), functools.partial(stage, recompute=True)
    one_row = with_changes(dataclasses.replace(shapes, rows_per_micro=1)).peak
    budget = Budget(one_row * 0.9 / FILL, "a test")  # even one row a pass is over
    advice = advise(on(), shapes, with_changes, budget, (False, ""), lora_adapters, True)
    assert [a.setting for a in advice] == ["trainer.optimizer_state_dtype", "trainer.micro_batch_size"]
    assert advice[0].value == "bfloat16"
    halved, rows = dataclasses.replace(shapes, moment_bytes=2), advice[1].value
    assert with_changes(dataclasses.replace(halved, rows_per_micro=rows)).peak <= FILL * budget.bytes
    assert with_changes(dataclasses.replace(halved, rows_per_micro=rows + 1)).peak > FILL * budget.bytes

    # tighter: bf16 moments alone no longer fit at one row, LoRA does
    halved_one_row = with_changes(dataclasses.replace(halved, rows_per_micro=1)).peak
    budget = Budget(halved_one_row * 0.95 / FILL, "a test")
    lora_peak = with_changes(dataclasses.replace(shapes, rows_per_micro=1, trainable=lora_adapters())).peak
    assert lora_peak < FILL * budget.bytes  # the case: full fine-tuning cannot fit, LoRA can
    advice = advise(on(), shapes, with_changes, budget, (False, ""), lora_adapters, True)
    assert [a.setting for a in advice][:1] == ["model.lora"]
    rows = advice[1].value if len(advice) > 1 else shapes.rows_per_micro
    lora = dataclasses.replace(shapes, trainable=lora_adapters())
    assert with_changes(dataclasses.replace(lora, rows_per_micro=rows)).peak <= FILL * budget.bytes
    if rows < shapes.rows_per_micro:
        assert with_changes(dataclasses.replace(lora, rows_per_micro=rows + 1)).peak > FILL * budget.bytes
    # on GPUs (LoRA already on): weights, gradients and optimizer state sharded by FSDP2 over the fewest GPUs
    gpu = advise(on("cuda", lora=object()), shapes, with_changes, budget, (False, ""), lora_adapters, True)
    assert gpu[0].setting == "trainer.strategy" and "trainer.world_size 2" in gpu[0].why
    rows = gpu[1].value if len(gpu) > 1 else shapes.rows_per_micro
    assert (
        with_changes(dataclasses.replace(shapes, rows_per_micro=rows), shards=2).peak <= FILL * budget.bytes
    )


def test_the_cli_takes_memory_and_names_a_bad_size(capsys):
    assert cli(["doctor", str(QUICKSTART), "--memory", "100MiB"]) == 0
    assert "set stages.1.explorer.max_concurrency" in capsys.readouterr().out
    assert cli(["doctor", str(QUICKSTART), "--memory", "lots"]) == 2
    assert "--memory 'lots' is not a size" in capsys.readouterr().err
