"""Parity of trainer.strategy: 5 GRPO steps (one update per batch; mini-batches x epochs with a KL loss) and
5 SFT steps give the same per-step loss and grad norm and the same final weights with one rank, two DDP
ranks and two FSDP2 ranks (fp32, same seed, same data), full fine-tuning and LoRA alike; the LoRA variant's
DDP and FSDP2 ranks with gradient checkpointing on.

The ranks are real processes in a gloo process group (tests/trainer/parity_worker.py)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("parity_worker.py")
RTOL = 1e-5
ATOL_WEIGHTS = 1e-5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(model_dir, tmp_path, strategy, world, use_lora="", env=None):
    out = tmp_path / f"{strategy}{world}{use_lora}.pt"
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(model_dir),
                str(out),
                strategy,
                str(r),
                str(world),
                init,
                use_lora,
            ],
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        for r in range(world)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return torch.load(out, weights_only=False)


def assert_same(reference, other, label, rtol=RTOL, atol_weights=ATOL_WEIGHTS):
    for scenario, ref in reference.items():
        got = other[scenario]
        for step, (a, b) in enumerate(zip(ref["steps"], got["steps"]), 1):
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=rtol, abs=1e-7), (label, scenario, step, key)
        assert ref["weights"].keys() == got["weights"].keys()
        for name, w in ref["weights"].items():
            gap = float((got["weights"][name] - w).abs().max())
            assert gap <= atol_weights, (label, scenario, name, gap)


@pytest.mark.integration
@pytest.mark.parametrize("use_lora", ["", pytest.param("lora", marks=pytest.mark.slow)], ids=["full", "lora"])
def test_single_ddp_and_fsdp2_give_the_same_steps(tiny_model_dir, tmp_path, use_lora):
    single = run(tiny_model_dir, tmp_path, "single", 1, use_lora)
    assert all(s["train/grad_norm"] > 0 for r in single.values() for s in r["steps"])  # the steps learn
    first, last = single["sft"]["steps"][0]["train/loss"], single["sft"]["steps"][-1]["train/loss"]
    assert last < first
    # the LoRA variant's ranks recompute their layers in backward (trainer.gradient_checkpointing, the memory
    # lever of large models; under DDP the recomputed forward runs inside DDP's backward, whose gradient
    # hooks must each fire once): the same steps as one rank that keeps its activations
    recompute = {"TRIVIUM_PARITY_RECOMPUTE": "1"} if use_lora else None
    for strategy in ("ddp", "fsdp2"):
        ranks = run(tiny_model_dir, tmp_path, strategy, 2, use_lora, env=recompute)
        assert [r["recomputes"] for r in ranks.values()] == [bool(use_lora)] * len(ranks), strategy
        assert_same(single, ranks, strategy)
    if use_lora:  # the merged export has the plain model's names and moved away from the base
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
        assert single["sft"]["weights"].keys() == base.keys()
        assert any(not torch.equal(single["sft"]["weights"][k], base[k]) for k in base)


@pytest.mark.integration
@pytest.mark.slow
def test_ddp_under_bf16_autocast_matches_one_rank(tiny_model_dir, tmp_path, monkeypatch):
    """trainer.precision bf16 with two DDP ranks against one bf16 rank: a rank's micro-batches hold other
    rows, so bf16 products differ in their last bits; per step, loss and grad norm agree within bf16
    rounding, and the weights' change agrees up to a few percent of its size (element-wise, AdamW
    amplifies the rounding where a gradient is near 0: measured 1-1.5% of the change's norm). The weights
    stay float32."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("TRIVIUM_PARITY_PRECISION", "bf16")
    single = run(tiny_model_dir, tmp_path, "single", 1)
    ddp = run(tiny_model_dir, tmp_path, "ddp", 2)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    for scenario, ref in single.items():
        got = ddp[scenario]
        for step, (a, b) in enumerate(zip(ref["steps"], got["steps"]), 1):
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=2e-2, abs=1e-4), (scenario, step, key)
        assert all(w.dtype == torch.float32 for w in got["weights"].values())
        gap = torch.cat([(got["weights"][k] - w).flatten() for k, w in ref["weights"].items()])
        moved = torch.cat([(w - start[k]).flatten() for k, w in ref["weights"].items()])
        assert float(gap.norm() / moved.norm()) < 0.05, scenario
