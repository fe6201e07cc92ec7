"""A run stopped by SIGTERM ends after a step with its checkpoint; a rerun continues; versions survive a
resume from a checkpoint that is not at a sync step."""

import signal
import subprocess
import sys
import time

import pytest
import yaml
from tests.launch.helpers import assert_same_records, trivium_run

from trivium.monitor.metrics import read_metrics


def sft_only(e2e, folder, name, steps=40):
    cfg = e2e.config(folder)
    cfg["name"] = name
    cfg["stages"] = cfg["stages"][:1]
    cfg["stages"][0]["buffer"]["total_steps"] = steps
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_sigterm_stops_after_a_step_with_a_checkpoint_and_a_rerun_continues(e2e, tmp_path):
    e2e.write(tmp_path)
    path = sft_only(e2e, tmp_path, "stopped")
    run_dir = tmp_path / "runs" / "e2e" / "stopped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(path)], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    step = int(err.split("stopped by SIGTERM after step ")[1].split()[0])
    assert 1 <= step < 40 and (run_dir / "checkpoints" / "sft" / f"step_{step}").is_dir()
    assert "run the same command again to continue" in err
    again = trivium_run(path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["step"] for r in read_metrics(run_dir) if "train/loss" in r] == list(range(1, 41))


@pytest.mark.integration
@pytest.mark.slow
def test_resume_between_sync_steps_keeps_the_versions(e2e, tmp_path):
    """sync_interval 2 with a checkpoint every step: the run resumes from step 3 (not a sync step) and
    samples, syncs and versions exactly as an uninterrupted run."""
    e2e.write(tmp_path)

    def grpo(name):
        cfg = e2e.config(tmp_path, grpo_steps=6)
        cfg["name"] = name
        cfg["stages"][0]["buffer"]["total_steps"] = 5
        cfg["stages"][1]["synchronizer"] = {"sync_interval": 2}
        cfg["stages"][1]["trainer"]["save_interval"] = 1
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    assert trivium_run(grpo("reference")).returncode == 0
    assert trivium_run(grpo("resumed"), "train:4").returncode == -9  # GRPO step 4: checkpoint at 3
    assert trivium_run(grpo("resumed")).returncode == 0
    got = read_metrics(tmp_path / "runs" / "e2e" / "resumed")
    assert_same_records(got, read_metrics(tmp_path / "runs" / "e2e" / "reference"))
    versions = [
        r["rollout/model_version"] for r in got if r["stage"] == "grpo" and "rollout/model_version" in r
    ]
    assert versions == [5, 5, 7, 7, 9, 9]  # the SFT stage ends at version 5; then k = 2


def test_a_sigterm_while_a_step_is_written_stops_after_the_next_step_with_its_checkpoint():
    """The stop request was read twice, before a step's checkpoint was asked for and after: a SIGTERM that
    landed between the two stopped the run naming a checkpoint that was never written (seen in the suite
    once, the test above failing on a missing step_2). Now a request that lands while a step is written is
    served after the next step, with that step's checkpoint. The loop's parts are stand-ins; the signal is
    real (this process sends itself SIGTERM while step 2 is written)."""
    import os
    from types import SimpleNamespace

    from trivium.config.schema import TriviumConfig
    from trivium.launch.loop import train_loop
    from trivium.launch.stopping import RunStopped

    saves = []

    class EndStep:
        state, total = SimpleNamespace(version=0), 5
        stage = SimpleNamespace(name="sft", config=TriviumConfig())
        progress = SimpleNamespace(close=lambda: None)

        def __call__(self, step, record, *, save, **_):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # handled by the loop's StopRequests: no exit
            saves.append((step, save))
            return f"checkpoints/sft/step_{step}" if save else None

    source = SimpleNamespace(
        next=lambda step, trainer_version: ([1], {}),
        eval_in_loop=lambda step: False,
        resume_state=dict,
        checkpointed=lambda: None,
        after_step=lambda step, evaluate: None,
        close=lambda: None,
    )
    trainer = SimpleNamespace(train_step=lambda batch: {"train/loss": 0.0})
    with pytest.raises(
        RunStopped, match=r"after step 3 of stage sft; its checkpoint is checkpoints/sft/step_3"
    ):
        train_loop(EndStep(), source, trainer, None, done=0, start_version=0, sync_interval=1)
    assert saves == [(1, False), (2, False), (3, True)]
