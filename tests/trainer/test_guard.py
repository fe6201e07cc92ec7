"""The guard in front of the weights: absurd rewards dropped, non-finite updates skipped, a run that keeps
producing them stopped, and no non-finite version ever published or loaded."""

import copy

import pytest
import torch
from tests.trainer.test_trainer import make_trainer, sampled_experiences

from trivium.trainer.guard import TrainingDiverged


def finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_absurd_rewards_are_dropped_and_the_rest_trains(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    poisoned = [exps[0].replace(reward=1e308), exps[1].replace(reward=float("nan")), *exps[2:]]
    reference = copy.deepcopy(policy)
    metrics = make_trainer(policy, micro=4).train_step(poisoned)
    make_trainer(reference, micro=4).train_step(exps[2:])
    assert metrics["train/dropped_experiences"] == 2.0 and metrics["train/skipped_updates"] == 0.0
    assert finite(policy)
    for a, b in zip(policy.parameters(), reference.parameters()):
        assert torch.equal(a, b)  # exactly the update of the clean experiences


def test_a_batch_of_only_absurd_rewards_is_a_skipped_step(policy, tokenizer):
    exps = [e.replace(reward=float("inf")) for e in sampled_experiences(policy, tokenizer)]
    before = copy.deepcopy(policy.state_dict())
    metrics = make_trainer(policy, micro=4).train_step(exps)
    assert metrics["train/skipped_steps"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_updates_with_absurd_gradients_are_skipped_until_the_run_stops(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    trainer = make_trainer(policy, micro=4, skip_grad_norm=1e-12, max_bad_steps=3)  # every norm is "absurd"
    before = copy.deepcopy(policy.state_dict())
    for _ in range(2):
        assert trainer.train_step(exps)["train/skipped_updates"] == 1.0
    with pytest.raises(TrainingDiverged, match="3 train steps in a row skipped updates"):
        trainer.train_step(exps)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert trainer.optim.scheduler.last_epoch == 0  # the schedule did not move either


def test_a_good_step_resets_the_count(policy, tokenizer):
    exps = sampled_experiences(policy, tokenizer)
    trainer = make_trainer(policy, micro=4, max_bad_steps=2)
    bad = [e.replace(reward=float("inf")) for e in exps]
    trainer.train_step(bad)
    trainer.train_step(exps)
    trainer.train_step(bad)  # one in a row again: no stop
    assert trainer.guard.bad_in_a_row == 1


def test_a_non_finite_version_is_never_published_or_loaded(policy, tokenizer, tmp_path):
    from trivium.models.transformers_engine import TransformersEngine
    from trivium.models.weights import WeightSyncError
    from trivium.sync.checkpoint import CheckpointSync
    from trivium.sync.memory import MemorySync

    state = {k: v.clone() for k, v in policy.state_dict().items()}
    state["model.norm.weight"][0] = float("nan")
    engine = TransformersEngine(copy.deepcopy(policy), tokenizer, device="cpu", dtype=torch.float32)
    with pytest.raises(WeightSyncError, match=r"model\.norm\.weight holds NaN or inf"):
        MemorySync(engine).publish(state, 1)
    with pytest.raises(WeightSyncError, match="holds NaN or inf"):
        CheckpointSync(tmp_path).publish(state, 1)
    assert engine.version == 0 and finite(engine.model)
