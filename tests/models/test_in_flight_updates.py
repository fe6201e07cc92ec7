"""Partial rollouts (explorer.rollout.in_flight_updates): a weight update that arrives while a batch decodes
is loaded at the next token, not after the batch; each token says which weights sampled it, and its
log-prob is exactly those weights' (what the trainer's rollout correction divides by)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from tests.models.test_transformers_engine import teacher_forced_logprobs

from trivium.models.loading import load_causal_lm
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.trainer.logprobs import batched_logprobs
from trivium.types import Task, collate
from trivium.workflows.base import experience_from_generation

PARAMS = SamplingParams(n=3, temperature=1.0, max_tokens=40)


def generate_across_an_update(engine, prompts, new_weights, after_tokens=5):
    """``engine.generate`` in a thread; once it decoded ``after_tokens`` tokens, ``update_weights`` from this
    thread (as the trainer's sync does). The generations, and whether the update returned mid-batch."""
    out, start = {}, engine.decode_steps
    worker = threading.Thread(target=lambda: out.setdefault("gens", engine.generate(prompts, PARAMS)))
    worker.start()
    deadline = time.monotonic() + 60
    while engine.decode_steps < start + after_tokens:
        assert worker.is_alive() and time.monotonic() < deadline, "the batch ended before the update"
        time.sleep(0.0005)
    engine.update_weights(new_weights, version=3)
    engine.weights_checksum()  # what a sync checks right after its update
    returned_mid_batch = worker.is_alive()  # neither waited for the batch to end
    worker.join(timeout=60)
    return [g for gens in out["gens"] for g in gens], returned_mid_batch


def test_an_update_mid_batch_is_loaded_at_the_next_token_and_each_token_keeps_its_version(
    tiny_dir: Path, other_tiny_dir: Path, prompts: list[list[int]]
) -> None:
    engine = TransformersEngine.from_pretrained(tiny_dir, seed=0)
    engine.in_flight_updates = True
    old = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    new = load_causal_lm(other_tiny_dir, dtype="float32", device="cpu")
    gens, returned_mid_batch = generate_across_an_update(engine, prompts, new.state_dict())
    assert returned_mid_batch and engine.version == 3 and engine.in_flight_loads == 1
    assert (
        engine.weights_checksum()
        == TransformersEngine(new, engine.tokenizer, device="cpu", dtype="float32").weights_checksum()
    )
    assert engine.metrics() == {"rollout/in_flight_weight_loads": 1.0}
    spanning = [g for g in gens if set(g.versions) == {0, 3}]
    assert spanning, [g.versions for g in gens]
    for g in gens:
        switch = g.versions.index(3) if 3 in g.versions else len(g.versions)
        assert g.versions == (0,) * switch + (3,) * (len(g.versions) - switch)  # one switch, never back
        # each token's log-prob is the teacher-forced log-prob of the weights that sampled it
        got = torch.tensor(g.logprobs)
        assert torch.allclose(got[:switch], teacher_forced_logprobs(old, g, 1.0)[:switch], atol=1e-4)
        assert torch.allclose(got[switch:], teacher_forced_logprobs(new, g, 1.0)[switch:], atol=1e-4)


def test_the_trainer_s_correction_divides_each_token_by_its_own_sampler(
    tiny_dir: Path, other_tiny_dir: Path, prompts: list[list[int]]
) -> None:
    """The experience records the versions (``info["token_versions"]``) and keeps each token's own
    log-prob: the trainer, holding the new weights, finds the new weights' tokens on-policy (importance
    weight 1) and the old weights' tokens not."""
    engine = TransformersEngine.from_pretrained(tiny_dir, seed=1)
    engine.in_flight_updates = True
    new = load_causal_lm(other_tiny_dir, dtype="float32", device="cpu")
    gens, _ = generate_across_an_update(engine, prompts, new.state_dict())
    g = next(g for g in gens if set(g.versions) == {0, 3})
    switch = g.versions.index(3)
    task = Task(task_id="t", data={}, workflow="math", reward_fn="math")
    e = experience_from_generation(g, reward=1.0, task=task, run_index=0, metrics={})
    assert e.info["token_versions"] == [[0, switch], [3, len(g.versions) - switch]]
    assert e.replace(model_version=0).action_versions() == list(g.versions)
    batch = collate([e], pad_token_id=0)
    trainer_lp = batched_logprobs(new, batch, micro_batch_size=1)[0]
    log_w = (trainer_lp - batch.rollout_logprobs[0])[batch.loss_mask[0]]  # the correction's log-weights
    assert torch.allclose(log_w[switch:], torch.zeros_like(log_w[switch:]), atol=1e-4)
    assert log_w[:switch].abs().max() > 1e-2


def test_without_in_flight_updates_an_update_waits_for_the_batch(
    tiny_dir: Path, other_tiny_dir: Path, prompts: list[list[int]]
) -> None:
    engine = TransformersEngine.from_pretrained(tiny_dir, seed=0)
    new = load_causal_lm(other_tiny_dir, dtype="float32", device="cpu")
    gens, returned_mid_batch = generate_across_an_update(engine, prompts, new.state_dict())
    assert not returned_mid_batch and engine.version == 3 and engine.metrics() == {}
    assert all(set(g.versions) == {0} for g in gens)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_in_flight_updates_in_a_row_each_land_once(tiny_dir: Path, other_tiny_dir: Path, busy: bool) -> None:
    """Updates while idle load at once; two in a row during one batch both land, in order."""
    engine = TransformersEngine.from_pretrained(tiny_dir, seed=0)
    engine.in_flight_updates = True
    a = load_causal_lm(tiny_dir, dtype="float32", device="cpu").state_dict()
    b = load_causal_lm(other_tiny_dir, dtype="float32", device="cpu").state_dict()
    if not busy:
        engine.update_weights(b, version=1)
        engine.update_weights(a, version=2)
        assert engine.version == 2 and engine.in_flight_loads == 0
        return
    prompt = [[1, 2, 3]]
    worker = threading.Thread(target=engine.generate, args=(prompt, SamplingParams(n=2, max_tokens=60)))
    start = engine.decode_steps
    worker.start()
    while engine.decode_steps < start + 2:
        time.sleep(0.0005)
    engine.update_weights(b, version=1)
    engine.update_weights(a, version=2)
    worker.join(timeout=60)
    assert engine.version == 2
