"""Issue 17, item 6: a real two-stage run logs the whole run's progress (monitor.metrics.RunProgress)."""

import logging

import pytest
import yaml

from trivium.cli import main as cli


@pytest.mark.integration
def test_a_two_stage_run_logs_each_stage_start_and_its_progress(e2e, tmp_path, caplog):
    e2e.write(tmp_path)
    cfg = e2e.config(tmp_path, grpo_steps=2)
    cfg["stages"][0]["buffer"]["total_steps"] = 4
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    with caplog.at_level(logging.INFO, logger="trivium.monitor.metrics"):
        assert cli(["run", "--config", str(tmp_path / "run.yaml")]) == 0
    lines = [r.message for r in caplog.records if r.message.startswith("run: stage")]
    assert (
        lines[0] == "run: stage 1/2 sft starts (4 steps); run 0/6 steps done, " + lines[0].split("done, ")[1]
    )
    steps = [line.split(", step ")[1].split(" (")[0] for line in lines if ", step " in line]
    assert steps == ["1/4", "2/4", "3/4", "4/4", "1/2", "2/2"]
    assert lines[5].startswith("run: stage 2/2 grpo starts (2 steps); run 4/6 steps done")
    assert lines[-1].endswith("~0:00 left in the stage, ~0:00 in the run")
