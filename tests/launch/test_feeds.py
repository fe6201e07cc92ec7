"""The explorer-to-trainer channel of mode both follows buffer.storage: its read policy and its backend."""

import json

import pytest
import sqlalchemy as sa
import yaml

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics


def config(folder, model_dir, data_dir, name, storage):
    return {
        "project": "feeds",
        "name": name,
        "checkpoint_root": str(folder / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {"rollout": {"max_tokens": 6}, "eval_at_start": False},
        "monitor": {"progress_bar": False},
        "buffer": {
            "batch_size": 2,
            "total_steps": 3,
            "taskset": {"path": str(data_dir / "train.jsonl"), "repeat_times": 2},
            "storage": storage,
        },
    }


def run(folder, cfg):
    path = folder / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "--config", str(path)]) == 0
    return folder / "runs" / "feeds" / cfg["name"]


@pytest.mark.integration
def test_replay_policy_is_honoured_in_mode_both(tmp_path, tiny_model_dir, word_problem_dir):
    """A negative use weight prefers what was trained on before: the trainer keeps replaying step 1's
    experiences, which FIFO (the feed mode both always built before) never does."""
    replay = {"version_weight": 0.0, "use_weight": -1.0, "cooldown_steps": 0}
    cfg = config(tmp_path, tiny_model_dir, word_problem_dir, "replay", {"policy": "replay", "replay": replay})
    # trainer.save_interval stays 0 (the default): a use counts once trained on, not once checkpointed
    run_dir = run(tmp_path, cfg)
    engine = sa.create_engine(f"sqlite:///{run_dir / 'buffer.sqlite'}")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT write_key, use_count, status FROM experiences ORDER BY id")).all()
    engine.dispose()
    assert len(rows) == 3 * 2 * 2
    uses = {}
    for key, use_count, status in rows:
        uses.setdefault(int(key.split(":")[1]), []).append(use_count)
        assert status == "ready"  # replay without max_uses keeps every experience servable
    assert uses[1] == [3, 3, 3, 3]  # step 1's experiences trained on at every step
    assert uses[2] == uses[3] == [0, 0, 0, 0]


@pytest.mark.integration
def test_jsonl_storage_backend_carries_mode_both(tmp_path, tiny_model_dir, word_problem_dir):
    run_dir = run(tmp_path, config(tmp_path, tiny_model_dir, word_problem_dir, "jsonl", {"backend": "jsonl"}))
    assert not (run_dir / "buffer.sqlite").exists()
    lines = [json.loads(x) for x in (run_dir / "buffer.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * 2 * 2
    assert sorted({line["fields"]["explore_step"] for line in lines}) == [1, 2, 3]
    steps = [r for r in read_metrics(run_dir) if "train/loss" in r]
    assert [r["train/sequences"] for r in steps] == [4.0, 4.0, 4.0]  # every experience trained once
