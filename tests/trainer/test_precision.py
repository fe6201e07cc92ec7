"""Mixed precision: which precision a run gets and why, bf16 numerics against fp32, fp32 master weights and
optimizer state, LoRA and the critic under autocast, the config checks."""

import copy
import json
import math
import os

import pytest
import torch
from tests.trainer.test_trainer import sampled_experiences

from trivium.config.schema import AlgorithmConfig, LoraConfig, TrainerConfig
from trivium.models import lora
from trivium.trainer.logprobs import token_logprobs
from trivium.trainer.precision import choose_precision
from trivium.trainer.spec import AlgorithmSpec
from trivium.trainer.trainer import Trainer
from trivium.types import collate

CPU = torch.device("cpu")


def trainer_for(model, precision, algorithm="grpo", sgd=False, **kw):
    cfg = TrainerConfig(lr=1e-3, micro_batch_size=4, grad_clip=0.0, precision=precision)
    spec = AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type=algorithm))
    trainer = Trainer(model, cfg, spec, pad_token_id=0, total_steps=10, max_response_length=12, **kw)
    if sgd:  # parameter change == -gradient
        trainer.optim.optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    return trainer


# --- the choice -------------------------------------------------------------------------------------------
# (the hardware probe for each kind of CPU and GPU: tests/models/test_bf16.py)
def test_auto_measures_before_it_takes_bf16(monkeypatch):
    """On native-bf16 hardware auto runs the probe: bf16 only where it pays (AUTO_MIN_SPEEDUP), and the
    reason names the measurement either way; without native bf16 nothing is measured."""
    from trivium.trainer.precision import AUTO_MIN_SPEEDUP, Probe

    runs = []

    def probe(ratio):
        return Probe("the test's pass", lambda: runs.append(ratio) or ratio)

    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    fast = choose_precision("auto", CPU, probe=probe(2.5))
    assert (fast.name, fast.dtype) == ("bf16", torch.bfloat16)
    assert runs == [2.5] and "bf16 ran the test's pass 2.50x as fast as fp32" in fast.reason
    small = choose_precision("auto", CPU, probe=probe(AUTO_MIN_SPEEDUP - 0.05))
    assert small.name == "fp32"
    assert (
        f"under the {AUTO_MIN_SPEEDUP}x" in small.reason
        and "trainer.precision: bf16 forces it" in small.reason
    )
    assert choose_precision("auto", CPU).name == "bf16"  # nothing to measure: the hardware's word

    def broken():
        raise RuntimeError("needs pixel_values")

    failed = choose_precision("auto", CPU, probe=Probe("a VLM's pass", broken))
    assert failed.name == "bf16" and "needs pixel_values" in failed.reason
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    runs.clear()
    chosen = choose_precision("auto", CPU, probe=probe(9.0))
    assert chosen.name == "fp32" and runs == []  # emulated bf16 is never measured, never chosen
    assert "TRIVIUM_FAST_BF16=0" in chosen.describe("auto")
    assert choose_precision("bf16", CPU).name == "bf16"  # asked for: given, with a note
    assert choose_precision("fp32", CPU).dtype is None
    # low-precision weights have no fp32 master copy: auto runs them as they are, bf16 is an error
    assert choose_precision("auto", CPU, torch.bfloat16).name == "fp32"
    with pytest.raises(ValueError, match=r"model\.dtype"):
        choose_precision("bf16", CPU, torch.bfloat16)


def test_the_probe_times_the_model_and_leaves_it_as_it_was(policy):
    """model_probe times the model's own pass (small models) without changing its weights, gradients,
    mode or the global random stream (a seeded run draws the same numbers with or without it)."""
    from trivium.trainer.precision import model_probe

    probe = model_probe(policy, CPU)
    assert "forward and backward" in probe.what
    policy.train()
    before = [p.detach().clone() for p in policy.parameters()]
    state = torch.get_rng_state()
    ratio = probe.speedup()
    assert ratio > 0
    assert torch.equal(state, torch.get_rng_state())
    assert policy.training and all(p.grad is None for p in policy.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_the_trainer_and_check_config_run_the_same_probe(policy, tiny_model_dir, monkeypatch):
    from trivium.config.schema import ModelConfig
    from trivium.models import bf16
    from trivium.trainer.precision import resolve

    seen = []
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    monkeypatch.setattr(bf16, "_speedup", lambda one_pass, sync: seen.append(one_pass) or 1.0)
    trainer = trainer_for(policy, "auto")
    assert trainer.precision.name == "fp32" and "1.00x" in trainer.precision.reason
    assert "0.1M parameters" in trainer.precision.reason or "M parameters" in trainer.precision.reason
    chosen = resolve("auto", ModelConfig(path=str(tiny_model_dir), device="cpu"))
    assert chosen.name == "fp32" and "forward and backward" in chosen.reason
    assert len(seen) == 2


def test_fp16_off_cuda_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"trainer.precision=fp16 needs a CUDA device"):
        choose_precision("fp16", CPU)


def test_config_check_names_the_field(tmp_path):
    from trivium.config.schema import TriviumConfig
    from trivium.validation.validate import check_semantics

    cfg = TriviumConfig.model_validate(
        {
            "model": {"path": str(tmp_path), "device": "cpu", "dtype": "bfloat16"},
            "trainer": {"precision": "fp16"},
        }
    )
    problems = [p for p in check_semantics(cfg, check_files=False) if "trainer.precision" in str(p)]
    text = " ".join(map(str, problems))
    assert len(problems) == 2, text
    assert "CUDA" in text and "model.dtype" in text


# --- numerics -----------------------------------------------------------------------------------------
def test_logprobs_are_float32_under_autocast(policy, tokenizer):
    batch = collate(sampled_experiences(policy, tokenizer, n_prompts=2, group=2), 0)
    fp32 = token_logprobs(policy, batch)
    with choose_precision("bf16", CPU).autocast():
        bf16 = token_logprobs(policy, batch)
    assert bf16.dtype == torch.float32
    mask = batch.loss_mask
    gap = (bf16 - fp32)[mask].abs()
    assert 0 < gap.max() < 0.1  # autocast ran (not bitwise fp32), within bf16's ~3 significant digits


def test_bf16_loss_and_gradient_match_fp32_within_bf16_tolerance(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    ma = trainer_for(a, "fp32", sgd=True).train_step(exps)
    mb = trainer_for(b, "bf16", sgd=True).train_step(exps)
    grad_a = torch.cat([(p0 - p).flatten() for p0, p in zip(policy.parameters(), a.parameters())])
    grad_b = torch.cat([(p0 - p).flatten() for p0, p in zip(policy.parameters(), b.parameters())])
    assert not torch.equal(grad_a, grad_b)  # bf16 really ran
    cosine = torch.nn.functional.cosine_similarity(grad_a, grad_b, dim=0)
    assert cosine > 0.99, float(cosine)
    assert (grad_b.norm() - grad_a.norm()).abs() / grad_a.norm() < 0.05
    assert mb["train/loss"] == pytest.approx(ma["train/loss"], abs=2e-2)
    # the rollout engine sampled in fp32: its gap to the bf16 trainer is logged, and bf16-sized
    assert 1e-4 < mb["mismatch/logprob_abs_max"] < 0.2
    assert ma["mismatch/logprob_abs_max"] < 1e-4


def test_weights_and_optimizer_state_stay_float32(policy, tokenizer):
    trainer = trainer_for(policy, "bf16")
    before = [p.detach().clone() for p in policy.parameters()]
    trainer.train_step(sampled_experiences(policy, tokenizer, n_prompts=2))
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    assert any(not torch.equal(p0, p) for p0, p in zip(before, policy.parameters()))
    state = [t for s in trainer.optim.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert {t.dtype for t in state if t.numel() > 1} == {torch.float32}
    assert trainer.optim.scaler is None  # bf16 needs no loss scaling


def test_lora_trains_under_bf16_with_float32_adapters(policy, tokenizer):
    model = lora.attach(policy, LoraConfig(rank=4, alpha=8))
    exps = sampled_experiences(policy, tokenizer, n_prompts=2)
    trainer = trainer_for(model, "bf16", algorithm="grpo", reference_is_base=True)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    metrics = trainer.train_step(exps)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(adapters[n], p)]
    assert changed and all(p.dtype == torch.float32 for p in model.parameters())


def test_critic_runs_under_bf16_with_float32_values(policy, tokenizer):
    from trivium.config.schema import CriticConfig
    from trivium.trainer.critic import Critic, ValueModel

    critic = Critic(ValueModel.from_causal_lm(policy), CriticConfig(), TrainerConfig(), 10, 12)
    trainer = trainer_for(policy, "bf16", algorithm="ppo", critic=critic)
    assert critic.precision is trainer.precision
    exps = sampled_experiences(policy, tokenizer, n_prompts=2)
    batch = collate(exps, 0)
    assert critic.values(batch, 4).dtype == torch.float32
    metrics = trainer.train_step(exps)
    assert torch.isfinite(torch.tensor(metrics["value/loss"]))
    assert all(p.dtype == torch.float32 for p in critic.model.parameters())
    state = [t for s in critic.optim.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert {t.dtype for t in state if t.numel() > 1} == {torch.float32}


def test_loss_scaling_skips_overflows_without_counting_them_as_bad_steps():
    """fp16's path through Optimization, with torch's CPU GradScaler standing in for CUDA's (the same
    class): an overflow skips the update and halves the scale; a finite step is unscaled before clipping."""
    from trivium.trainer.optim import Optimization

    model = torch.nn.Linear(3, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    optim = Optimization(model, TrainerConfig(lr=0.1, grad_clip=0.0))
    optim.scaler = scaler
    optim.plan(10)
    x = torch.ones(1, 3)
    before = [p.detach().clone() for p in model.parameters()]
    optim.backward(model(x).sum() * float("inf"))
    assert not math.isfinite(optim.step())
    assert optim.overflows == 1 and optim.skipped == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.get_scale() == 512.0
    optim.backward(model(x).sum())
    norm = optim.step()
    assert norm == pytest.approx(2.0)  # unscaled: d(sum(w.x + b))/d(w, b) = (1, 1, 1, 1), norm 2
    assert not torch.equal(before[0], model.weight)
    assert "grad_scaler" in optim.state_dict()


def test_a_measurement_is_kept_so_that_every_run_on_a_machine_decides_the_same(monkeypatch, tmp_path):
    """The probe measured the quickstart's model at 1.14x to 1.33x from run to run around the 1.2x threshold,
    so auto flipped between bf16 and fp32. The first measurement of a pass on a machine is kept and read
    back; another pass, a damaged file or TRIVIUM_PROBE_CACHE=0 measure again."""
    from trivium.trainer.precision import Probe

    kept = tmp_path / "cache" / "precision_probe.json"
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    monkeypatch.setenv("TRIVIUM_PROBE_CACHE", str(kept))
    monkeypatch.setenv("TRIVIUM_PROBE_MAX_LOAD", "1e9")  # the test suite's own load must not decide it
    runs = []

    def probe(ratio, key="model pass X"):
        return Probe("the test's pass", lambda: runs.append(ratio) or ratio, key)

    first = choose_precision("auto", CPU, probe=probe(1.3))
    assert first.name == "bf16" and f"kept in {kept} so that later runs here decide the same" in first.reason
    again = choose_precision("auto", CPU, probe=probe(1.1))  # this run's timing would say fp32
    assert again.name == "bf16" and runs == [1.3]
    assert "1.30x" in again.reason and "delete it to measure again" in again.reason
    assert choose_precision("auto", CPU, probe=probe(1.1, "model pass Y")).name == "fp32"  # another model
    kept.write_text("{not json")
    assert choose_precision("auto", CPU, probe=probe(1.1)).name == "fp32" and runs == [1.3, 1.1, 1.1]
    assert choose_precision("auto", CPU, probe=probe(1.5)).name == "fp32"  # the rewritten file's answer
    monkeypatch.setenv("TRIVIUM_PROBE_CACHE", "0")
    assert choose_precision("auto", CPU, probe=probe(1.5)).name == "bf16" and runs[-1] == 1.5


def test_the_model_probe_is_keyed_by_architecture_not_by_folder(policy):
    from trivium.trainer.precision import model_probe, shape_probe

    key = model_probe(policy, CPU).cache_key
    assert key.startswith("model pass ") and key == model_probe(policy, CPU).cache_key
    assert shape_probe((64, 128), CPU).cache_key == "MLP 64x128"


def test_runs_started_together_measure_once_and_all_decide_the_same(tmp_path):
    """Three benchmark runs started at once each found no kept measurement, timed bf16 against each other's
    load and decided fp32, bf16, bf16. The first now measures under a lock; the others wait and read it."""
    import subprocess
    import sys

    kept = tmp_path / "precision_probe.json"
    code = (
        "import sys, time, torch\n"
        "from trivium.trainer.probe_cache import remembered_speedup\n"
        "def measure():\n"
        "    time.sleep(0.5)\n"  # long enough for every process to be waiting, were there no lock
        "    return float(sys.argv[1])\n"
        "print(remembered_speedup('model pass Z', torch.device('cpu'), measure)[0])\n"
    )
    env = {**os.environ, "TRIVIUM_PROBE_CACHE": str(kept), "TRIVIUM_PROBE_MAX_LOAD": "1e9"}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, ratio], env=env, stdout=subprocess.PIPE, text=True)
        for ratio in ("1.1", "1.3", "1.5")
    ]
    ratios = {float(p.communicate(timeout=120)[0].strip()) for p in procs}
    assert len(ratios) == 1, ratios  # one measurement, whichever process took the lock first
    assert len(json.loads(kept.read_text())) == 1


def test_a_measurement_taken_on_a_busy_machine_is_used_but_not_kept(monkeypatch, tmp_path):
    """Under load the quickstart's model measured bf16 at 0.59x fp32 (1.95x idle); kept, that would hold every
    later run there on fp32. A busy machine's measurement decides this run only."""
    from trivium.trainer.precision import Probe

    kept = tmp_path / "precision_probe.json"
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    monkeypatch.setenv("TRIVIUM_PROBE_CACHE", str(kept))
    monkeypatch.setenv("TRIVIUM_PROBE_MAX_LOAD", "-1")  # any load average is above it: busy
    busy = choose_precision("auto", CPU, probe=Probe("the test's pass", lambda: 0.6, "model pass B"))
    assert busy.name == "fp32" and "not kept: the machine was busy" in busy.reason and not kept.exists()
    monkeypatch.setenv("TRIVIUM_PROBE_MAX_LOAD", "1e9")
    idle = choose_precision("auto", CPU, probe=Probe("the test's pass", lambda: 1.9, "model pass B"))
    assert idle.name == "bf16" and "so that later runs here decide the same" in idle.reason and kept.exists()
