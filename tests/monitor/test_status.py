"""status.json: running / finished / stopped / failed, and a killed process recognised as killed."""

import json
import signal
import subprocess
import sys

import pytest

from trivium.monitor.status import read_status, recorded, status_path, write_status


class Stop(Exception):
    pass


def test_recorded_says_finished_stopped_or_failed_with_the_reason(tmp_path):
    with recorded(tmp_path, None, (Stop,), config="a.yaml"):
        assert read_status(tmp_path)["state"] == "running"
    done = read_status(tmp_path)
    assert done["state"] == "finished" and done["config"] == "a.yaml" and done["started"] <= done["updated"]
    with pytest.raises(Stop), recorded(tmp_path, "train", (Stop,)):
        raise Stop("stopped by SIGTERM after step 3\nmore")
    assert read_status(tmp_path, "train")["error"] == "Stop: stopped by SIGTERM after step 3"
    assert read_status(tmp_path, "train")["state"] == "stopped"
    with pytest.raises(ValueError), recorded(tmp_path, None, (Stop,)):
        raise ValueError("bad row 7")
    assert read_status(tmp_path)["state"] == "failed" and "bad row 7" in read_status(tmp_path)["error"]


def test_a_running_status_whose_process_is_gone_reads_as_killed(tmp_path):
    code = (
        "import sys, time; from trivium.monitor.status import write_status; "
        "write_status(sys.argv[1], 'running'); print('up', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    assert read_status(tmp_path)["state"] == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_status(tmp_path)["state"] == "killed"
    assert json.loads(status_path(tmp_path).read_text())["state"] == "running"  # the file is not rewritten


def test_no_status_file_and_bad_states(tmp_path):
    assert read_status(tmp_path) is None
    status_path(tmp_path).write_text("{half")
    assert read_status(tmp_path) is None
    with pytest.raises(ValueError, match="not one of"):
        write_status(tmp_path, "exploded")


def test_a_resumed_stage_drops_its_trajectory_records_after_the_resume_step(tmp_path):
    from trivium.monitor.trajectories import TRAJECTORIES_FILE, TrajectoryRecorder, read_trajectories

    lines = [{"stage": "sft", "step": 9}, *({"stage": "grpo", "step": s} for s in (1, 2, 3, 4))]
    (tmp_path / TRAJECTORIES_FILE).write_text(
        "".join(json.dumps(x) + "\n" for x in lines) + '{"stage": "grpo", "st'
    )
    TrajectoryRecorder(tmp_path, "grpo", every=1, per_step=2, tokenizer=None, resume_step=2)
    assert [(r["stage"], r["step"]) for r in read_trajectories(tmp_path)] == [
        ("sft", 9),
        ("grpo", 1),
        ("grpo", 2),
    ]


def test_image_spans_locate_each_pictures_visual_tokens_or_give_up():
    from trivium.monitor.trajectories import image_spans

    tokens = [5, 9, 9, 9, 6, 1, 2, 5, 9, 9, 6]
    assert image_spans(tokens, 9, 2) == [[1, 4], [8, 10]]
    assert image_spans(tokens, 9, 3) == []  # runs that do not match the images: shown as tokens
    assert image_spans(tokens, None, 2) == []  # the placeholder is unknown
    assert image_spans([9, 9, 9], 9, 1) == [[0, 3]]
