"""Exact resume: a run killed with SIGKILL at several points and restarted ends exactly like an
uninterrupted one, every experience in its persistent buffer trained exactly once."""

import json
import subprocess
import sys

import pytest
import yaml
from tests.launch.helpers import assert_same_records, trivium_run

from trivium.buffer.storage_sql import SqlStorage
from trivium.monitor.metrics import read_metrics

GRPO_STEPS = 8


def make_config(e2e, folder, name):
    cfg = e2e.config(folder, grpo_steps=GRPO_STEPS)
    cfg["name"] = name
    # one CPU thread: no thread team whose partition of a reduction could differ between the processes
    cfg["runtime"] = {"num_threads": 1}
    cfg["stages"][0]["buffer"]["total_steps"] = 10
    cfg["stages"][0]["trainer"]["save_interval"] = 1
    grpo = cfg["stages"][1]
    grpo["buffer"]["storage"] = {}  # the explorer-to-trainer channel is a SQLite file in the run folder
    grpo["trainer"]["save_interval"] = 1
    grpo["explorer"]["eval_interval"] = 3
    return cfg


@pytest.mark.integration
def test_killed_and_resumed_run_equals_uninterrupted_run(e2e, tmp_path):
    e2e.write(tmp_path)
    reference, resumed = tmp_path / "reference.yaml", tmp_path / "resumed.yaml"
    reference.write_text(yaml.safe_dump(make_config(e2e, tmp_path, "reference")))
    resumed.write_text(yaml.safe_dump(make_config(e2e, tmp_path, "resumed")))
    assert trivium_run(reference).returncode == 0

    # SFT step 4 mid-step, GRPO step 3 after sampling, GRPO step 6 inside the checkpoint write
    for kill_at in ("train:4", "explore:3", "checkpoint:6"):
        result = trivium_run(resumed, kill_at)
        assert result.returncode == -9, (kill_at, result.stderr[-2000:])
    run_dir = tmp_path / "runs" / "e2e" / "resumed"
    assert (run_dir / "checkpoints" / "grpo" / "step_6.tmp").exists()  # the half-written checkpoint
    final = trivium_run(resumed)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming" in final.stderr and "step_5" in final.stderr  # not the half-written step 6

    ref = read_metrics(tmp_path / "runs" / "e2e" / "reference")
    got = read_metrics(run_dir)
    assert [(r["stage"], r["step"]) for r in got] == [(r["stage"], r["step"]) for r in ref]
    assert_same_records(got, ref)

    storage = SqlStorage(run_dir / "buffer.sqlite")
    per_step = 8 * 8
    assert storage.count("consumed") == GRPO_STEPS * per_step  # every experience trained once ...
    assert storage.count("ready") == 0 and storage.count("claimed") == 0  # ... and none left over
    storage.close()
    meta = json.loads((run_dir / "checkpoints" / "grpo" / f"step_{GRPO_STEPS}" / "meta.json").read_text())
    assert meta["step"] == GRPO_STEPS and meta["global_step"] == 10 + GRPO_STEPS


def test_no_resume_refuses_an_existing_run(e2e, tmp_path):
    e2e.write(tmp_path)
    cfg = make_config(e2e, tmp_path, "once")
    cfg["stages"] = cfg["stages"][:1]
    cfg["stages"][0]["buffer"]["total_steps"] = 2
    path = tmp_path / "once.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert trivium_run(path).returncode == 0
    again = subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--no-resume"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "--no-resume" in again.stderr and "--overwrite" in again.stderr
    rerun = trivium_run(path)  # finished: resuming does nothing more
    assert rerun.returncode == 0 and len(read_metrics(tmp_path / "runs" / "e2e" / "once")) == 2


class _RunsCode:
    def __reduce__(self):  # unpickling this would call print(...): any code could run the same way
        return (print, ("code ran while loading a checkpoint",))


def test_a_checkpoint_that_needs_code_to_load_is_refused(tmp_path, capsys):
    import torch

    from trivium.launch.resume import ResumePoint

    torch.save({"step": 1, "payload": _RunsCode()}, tmp_path / "trainer_state.pt")
    point = ResumePoint(0, "sft", 1, 1, 1, tmp_path)
    with pytest.raises(RuntimeError, match=r"trainer_state\.pt cannot be loaded as plain tensors"):
        point.trainer_state()
    assert "code ran" not in capsys.readouterr().out


def test_a_resume_across_one_process_and_several_ranks_is_refused_before_anything_loads(tmp_path):
    from trivium.launch.resume import ResumePoint, ResumeRefused, check_strategy

    single = ResumePoint(0, "sft", 3, 3, 3, tmp_path / "step_3", strategy="single", world_size=1)
    with pytest.raises(ResumeRefused) as refused:
        check_strategy(single, "ddp", 2)
    said = str(refused.value)
    assert "written by trainer.strategy single on 1 rank(s)" in said and "ddp on 2" in said
    assert "trainer.strategy single and trainer.world_size 1" in said
    assert f"model.path={tmp_path / 'step_3' / 'model'}" in said
    sharded = ResumePoint(0, "sft", 3, 3, 3, tmp_path, strategy="fsdp2", world_size=2)
    with pytest.raises(ResumeRefused, match="fsdp2 on 2 rank"):
        check_strategy(sharded, "single", 1)
    check_strategy(sharded, "fsdp2", 1)  # shards reshard to another world size
    check_strategy(sharded, "ddp", 4)
    check_strategy(single, "single", 1)
