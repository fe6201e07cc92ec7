"""Checkpoint weight sync between two OS processes: atomic versions, checksums, torn writes ignored."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from trivium.models.transformers_engine import TransformersEngine
from trivium.models.weights import WeightSyncError, weights_checksum
from trivium.sync.checkpoint import CheckpointSync

PUBLISHER = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM
    from trivium.sync.checkpoint import CheckpointSync
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    sync = CheckpointSync(sys.argv[2])
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * version)
        sync.publish(model.state_dict(), version)
    print(sync.latest()[0])
""")


@pytest.mark.integration
def test_weights_published_by_another_process_reach_the_engine(tiny_model_dir, tmp_path):
    folder = tmp_path / "sync"
    out = subprocess.run(
        [sys.executable, "-c", PUBLISHER, str(tiny_model_dir), str(folder)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "3"
    assert sorted(p.name for p in folder.iterdir()) == ["v00000002", "v00000003"]  # keep=2
    engine = TransformersEngine.from_pretrained(tiny_model_dir, seed=0)
    before = weights_checksum(engine.state_dict())
    sync = CheckpointSync(folder)
    assert sync.pull(engine) == 3
    assert engine.version == 3
    meta = json.loads((folder / "v00000003" / "meta.json").read_text())
    assert weights_checksum(engine.state_dict()) == meta["checksum"] != before
    assert sync.pull(engine) is None  # nothing newer


def test_half_written_version_is_never_loaded_and_mismatch_is_an_error(tiny_model_dir, tmp_path):
    engine = TransformersEngine.from_pretrained(tiny_model_dir, seed=0)
    sync = CheckpointSync(tmp_path)
    state = {k: v.clone() for k, v in engine.state_dict().items()}
    sync.publish(state, 1)
    (tmp_path / "v00000002.tmp").mkdir()  # a publisher killed mid-write
    (tmp_path / "v00000002.tmp" / "model.safetensors").write_bytes(b"garbage")
    assert sync.latest()[0] == 1
    assert sync.pull(engine) == 1
    sync.publish(state, 4)
    (tmp_path / "v00000004" / "meta.json").write_text(json.dumps({"version": 4, "checksum": "0" * 64}))
    with pytest.raises(WeightSyncError, match="differs from the sent weights"):
        sync.pull(engine)


def test_checksum_sees_every_change():
    a = {"w": torch.ones(3), "b": torch.zeros(2)}
    b = {"w": torch.ones(3), "b": torch.tensor([0.0, 1e-7])}
    assert weights_checksum(a) != weights_checksum(b)
    assert weights_checksum(a) == weights_checksum({"b": torch.zeros(2), "w": torch.ones(3)})
    assert weights_checksum(a) != weights_checksum(
        {"w": torch.ones(3, dtype=torch.float64), "b": torch.zeros(2)}
    )


def test_collective_layout_and_schedule():
    from trivium.sync.collective import _flatten, _unflatten
    from trivium.sync.versions import versions_needed

    state = {"b": torch.arange(3.0), "a": torch.ones(2, 2), "n": torch.tensor([7], dtype=torch.int64)}
    flats = _flatten(state, torch.device("cpu"))
    assert len(flats) == 2  # one buffer per dtype
    back = _unflatten(state, flats)
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert versions_needed(5, 2) == [2, 4]
    assert versions_needed(4, 1) == [1, 2, 3]
    assert versions_needed(5, 2, start=10) == [12, 14]
    assert versions_needed(5, 1, offset=1) == [1, 2, 3]  # one step ahead: step s waits for s - 2


def test_engine_in_another_precision_loads_fp32_versions_and_still_catches_damage(tiny_model_dir, tmp_path):
    """explorer.rollout.dtype bfloat16 under an fp32 trainer: the engine holds the weights cast to bf16, the
    check compares against the published weights cast the same way, and a damaged file is still caught."""
    engine = TransformersEngine.from_pretrained(tiny_model_dir, dtype="bfloat16", seed=0)
    trainer_state = {k: v.float() + 0.01 for k, v in engine.state_dict().items()}
    sync = CheckpointSync(tmp_path)
    sync.publish(trainer_state, 1)
    assert sync.pull(engine) == 1
    loaded = engine.state_dict()
    assert loaded["model.norm.weight"].dtype is torch.bfloat16
    assert weights_checksum(loaded) == weights_checksum(trainer_state, torch.bfloat16)
    assert weights_checksum(loaded) != weights_checksum(trainer_state)
    sync.publish(trainer_state, 2)
    (tmp_path / "v00000002" / "meta.json").write_text(json.dumps({"version": 2, "checksum": "0" * 64}))
    with pytest.raises(WeightSyncError, match=r"does not match its meta\.json checksum"):
        sync.pull(engine)
    assert engine.version == 1  # the damaged version was not loaded


def test_checksum_of_a_cast_equals_the_checksum_of_the_cast_tensors():
    from trivium.models.weights import cast_floating, floating_dtype

    state = {"w": torch.randn(4), "step": torch.tensor([3])}
    cast = cast_floating(state, torch.bfloat16)
    assert cast["step"].dtype is torch.int64 and floating_dtype(cast) is torch.bfloat16
    assert weights_checksum(state, torch.bfloat16) == weights_checksum(cast) != weights_checksum(state)
    assert weights_checksum(state, torch.float32) == weights_checksum(state)
