"""online_difficulty survives a SIGKILL exactly: a run killed after sampling and resumed selects the same tasks
(the same metrics, rewards and informative-group counts included) as an uninterrupted one, because the
posteriors travel in the explorer state of every checkpoint."""

import pytest
import yaml
from tests.launch.helpers import assert_same_records, trivium_run

from trivium.monitor.metrics import read_metrics


def make_config(e2e, folder, name):
    cfg = e2e.config(folder, grpo_steps=5)
    cfg["name"] = name
    cfg["stages"][0]["buffer"]["total_steps"] = 10
    cfg["buffer"]["eval_tasksets"] = []  # no evaluation: the test is about selection
    grpo = cfg["stages"][1]
    grpo["buffer"]["selector"] = "online_difficulty"
    grpo["buffer"]["experience_ops"] = [{"name": "duplicate_responses"}]
    grpo["buffer"]["taskset"]["max_rows"] = 16  # tasks come back, so the posteriors steer the choice
    grpo["trainer"]["save_interval"] = 1
    return cfg


@pytest.mark.integration
@pytest.mark.slow
def test_online_difficulty_killed_and_resumed_selects_like_an_uninterrupted_run(e2e, tmp_path):
    e2e.write(tmp_path)
    reference, resumed = tmp_path / "reference.yaml", tmp_path / "resumed.yaml"
    reference.write_text(yaml.safe_dump(make_config(e2e, tmp_path, "reference")))
    resumed.write_text(yaml.safe_dump(make_config(e2e, tmp_path, "resumed")))
    first = trivium_run(reference, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    killed = trivium_run(resumed, "explore:3", timeout=900)
    assert killed.returncode == -9, killed.stderr[-2000:]
    final = trivium_run(resumed, timeout=900)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming" in final.stderr

    ref = read_metrics(tmp_path / "runs" / "e2e" / "reference")
    got = read_metrics(tmp_path / "runs" / "e2e" / "resumed")
    assert [(r["stage"], r["step"]) for r in got] == [(r["stage"], r["step"]) for r in ref]
    assert_same_records(got, ref)
    grpo = [r for r in got if r["stage"] == "grpo"]
    assert all("ops/duplicate_responses/kept" in r and "rollout/informative_groups" in r for r in grpo)
