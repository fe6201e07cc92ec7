"""A damaged checkpoint stops the resume with a message naming it and the way back (issue 26 item 6).

Before: an empty trainer_state.pt raised IndexError, a garbage meta.json JSONDecodeError, wrong types
TypeError, each as a traceback. Now each is ``CheckpointDamaged`` (exit 2): the folder, what is wrong, and
the newest intact checkpoint before it with the command that moves the damaged one aside; doing that and
running again continues from the earlier checkpoint.
"""

import shutil

import pytest
import torch
import yaml
from tests.launch.helpers import tiny_run_config

from trivium.cli import main as cli
from trivium.monitor.metrics import read_metrics


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir, word_problem_dir):
    """An SFT run of 3 steps with a checkpoint after each (kept), to copy and damage."""
    folder = tmp_path_factory.mktemp("damage")
    cfg = tiny_run_config(folder, tiny_model_dir, "damage", "sft")
    cfg.update(mode="train", algorithm={"algorithm_type": "sft"})
    cfg["trainer"] = {"save_interval": 1, "keep_checkpoints": 3, "micro_batch_size": 2}
    sft = {
        "path": str(word_problem_dir / "sft.jsonl"),
        "fields": {"prompt": "question", "response": "answer"},
    }
    cfg["buffer"] = {"batch_size": 2, "total_steps": 3, "sft_dataset": sft}
    path = folder / "sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli(["run", "-c", str(path)]) == 0
    return folder, path


def damaged_copy(finished, tmp_path, damage):
    """A copy of the finished run whose last metric record is dropped (so a rerun resumes) and whose
    step_3 checkpoint ``damage(folder)`` breaks; the copy's config path."""
    folder, path = finished
    run = tmp_path / "runs" / "damage" / "sft"
    shutil.copytree(folder / "runs" / "damage" / "sft", run)
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))
    cfg = yaml.safe_load(path.read_text())
    cfg["checkpoint_root"] = str(tmp_path / "runs")
    cfg["buffer"]["total_steps"] = 4  # the copy has a step left to run after its resume
    copy = tmp_path / "sft.yaml"
    copy.write_text(yaml.safe_dump(cfg))
    damage(run / "checkpoints" / "main" / "step_3")
    return copy, run


DAMAGE = {
    "meta.json not JSON": (lambda d: (d / "meta.json").write_text("{garbage"), "meta.json is not JSON"),
    "meta.json of wrong types": (
        lambda d: (d / "meta.json").write_text(
            '{"stage": "main", "step": "3", "global_step": 3, "version": 3}'
        ),
        "meta.json has step='3', not a int",
    ),
    "empty trainer state": (lambda d: (d / "trainer_state.pt").write_bytes(b""), "trainer_state.pt"),
    "trainer state of the wrong shape": (
        lambda d: torch.save([1, 2, 3], d / "trainer_state.pt"),
        "holds a list, not the trainer's state",
    ),
    "optimizer state of wrong types": (
        lambda d: torch.save({**torch.load(d / "trainer_state.pt"), "optimizer": 5}, d / "trainer_state.pt"),
        "Error",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_is_named_with_the_way_back_to_the_one_before(finished, tmp_path, case, capsys):
    damage, says = DAMAGE[case]
    config, run = damaged_copy(finished, tmp_path, damage)
    assert cli(["run", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    step_3 = run / "checkpoints" / "main" / "step_3"
    assert f"checkpoint {step_3} is damaged" in err and says in err, err
    assert f"mv {step_3} {step_3}.damaged" in err and "continue from main/step_2" in err
    assert "Traceback" not in err

    step_3.rename(step_3.with_name("step_3.damaged"))  # what the message says to do
    assert cli(["run", "-c", str(config)]) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]  # from step 2's checkpoint on
