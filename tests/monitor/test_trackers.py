"""Experiment trackers (monitor.backends): the records each tracker gets, once per (key, step), across a
resume; config errors for unknown or uninstalled backends; and whole runs, killed and resumed, read back
with tensorboard's, wandb's and mlflow's own readers (and from a live `tensorboard` over HTTP)."""

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from tests.launch.helpers import trivium_run
from tests.launch.kills import grpo_config, run_dir, write
from tests.monitor.recording_tracker import calls
from tests.monitor.tracker_readers import mlflow_run, tensorboard_scalars, wandb_run

from trivium.config import ConfigError
from trivium.config.schema_monitor import MonitorConfig
from trivium.monitor.metrics import MetricsWriter, read_metrics
from trivium.monitor.tracker_set import TrackerSet
from trivium.monitor.trackers import TRACKERS, Tracker
from trivium.validation import load_config

RECORDING = "tests.monitor.recording_tracker:RecordingTracker"


def open_set(tmp_path, **kw):
    monitor = MonitorConfig(backends=["jsonl", RECORDING])
    return TrackerSet(monitor, tmp_path, project="p", name="n", resolved={"main": {"seed": 0}}, **kw)


def test_each_key_and_step_reaches_a_tracker_once_across_a_resume(tmp_path):
    writer = MetricsWriter(tmp_path, trackers=open_set(tmp_path))
    writer.write({"stage": "a", "step": 1, "global_step": 1, "train/loss": 0.5, "flag": True})
    writer.write({"stage": "a", "step": 2, "global_step": 2, "train/loss": 0.4, "eval/t/accuracy": 0.25})
    # the next stage's start-of-stage eval shares global step 2: only its new key is sent
    writer.write({"stage": "b", "step": 0, "global_step": 2, "eval/t/accuracy": 0.25, "eval/u/accuracy": 1})
    writer.write({"stage": "b", "step": 1, "global_step": 3, "train/loss": 0.3})
    writer.close()

    # a resumed process: the checkpoint was at global step 2, so step 3 is written again
    writer = MetricsWriter(tmp_path, trackers=open_set(tmp_path))
    assert writer.drop_after(2) == 1
    writer.write({"stage": "b", "step": 1, "global_step": 3, "train/loss": 0.3})
    writer.write({"stage": "b", "step": 2, "global_step": 4, "train/loss": 0.2, "model": "x"})
    writer.close()

    got = calls(tmp_path)
    assert [c["call"] for c in got] == ["config", "log", "log", "log", "log", "close", "log", "close"]
    logs = [(c["step"], c["scalars"]) for c in got if c["call"] == "log"]
    assert logs == [
        (1, {"train/loss": 0.5}),  # booleans and the step fields are not scalars
        (2, {"train/loss": 0.4, "eval/t/accuracy": 0.25}),
        (2, {"eval/u/accuracy": 1.0}),
        (3, {"train/loss": 0.3}),
        (4, {"bench/x/train/loss": 0.2}),  # a bench record's keys carry its model
    ]
    state = json.loads((tmp_path / "trackers.json").read_text())[RECORDING]
    assert state["saved"] == {"opened": 2}  # what the tracker saved reached its second process
    assert [r["global_step"] for r in read_metrics(tmp_path)] == [1, 2, 2, 3, 4]


@pytest.mark.integration
def test_a_killed_process_whose_wandb_records_landed_sends_them_once(tmp_path, request):
    """wandb's service is a process of its own: a SIGKILLed run's records may land in the offline file (seen
    in CI), and the resumed run sent them again from metrics.jsonl (steps 1, 2, 1, 2, 3). Here: the first
    process's records are written, then its trackers.json is put back as a killed process leaves it (the
    run id saved, no steps, since wandb is not durable); the resumed process asks the files."""
    wandb = pytest.importorskip("wandb")
    monitor = MonitorConfig(backends=["jsonl", "wandb"])
    # this process's wandb service is announced in os.environ (WANDB_SERVICE): the `trivium run` processes
    # that later tests of this worker start would join it, and a killed one's run id would stay "in use"
    # there; teardown stops the service and removes the announcement
    request.addfinalizer(wandb.teardown)

    def writer():
        trackers = TrackerSet(monitor, tmp_path, project="p", name="n", replay=tmp_path / "metrics.jsonl")
        return MetricsWriter(tmp_path, trackers=trackers)

    first = writer()
    for step in (1, 2):
        first.write({"stage": "a", "step": step, "global_step": step, "train/loss": 1.0 / step})
    killed = json.loads((tmp_path / "trackers.json").read_text())
    first.close()
    assert killed["wandb"]["logged"] == {} and killed["wandb"]["saved"]["id"]
    (tmp_path / "trackers.json").write_text(json.dumps(killed))

    second = writer()
    second.write({"stage": "a", "step": 3, "global_step": 3, "train/loss": 1.0 / 3})
    second.close()
    history, _, sessions = wandb_run(tmp_path, killed["wandb"]["saved"]["id"])
    assert [s for s, _ in history["train/loss"]] == [1, 2, 3] and sessions == 2


def test_user_tracker_gets_its_args_and_decoupled_roles_keep_separate_state(tmp_path):
    monitor = MonitorConfig(backends=[RECORDING], backend_args={RECORDING: {"file": "mine.jsonl"}})
    for role in ("explore", "train"):
        trackers = TrackerSet(monitor, tmp_path, project="p", name="n", role=role)
        trackers.log({"global_step": 1, "x": 1.0})
        trackers.close(failed=role == "train")
    assert [c["call"] for c in calls(tmp_path, "mine.jsonl")] == ["log", "close", "log", "close"]
    assert calls(tmp_path, "mine.jsonl")[-1] == {"call": "close", "failed": True}
    assert (tmp_path / "trackers.explore.json").exists() and (tmp_path / "trackers.train.json").exists()


def _problems(tmp_path, backends):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"mode": "bench", "monitor": {"backends": backends}}))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cfg.yaml", check_files=False)
    return [p for p in info.value.problems if p.path.startswith("monitor")]


def test_unknown_backend_and_missing_library_are_config_errors_naming_field_and_extra(tmp_path):
    (problem,) = _problems(tmp_path, ["jsonl", "tensorbord"])
    assert problem.path == "monitor.backends[1]" and "did you mean 'tensorboard'" in problem.fix

    class NeedsMissingLibrary(Tracker):
        requires, extra = "trivium_test_library_not_installed", "nolib"

    with TRACKERS.snapshot():
        TRACKERS.register("nolib")(NeedsMissingLibrary)
        (problem,) = _problems(tmp_path, ["nolib", "jsonl"])
    assert problem.path == "monitor.backends[0]"
    assert (
        "trivium_test_library_not_installed" in problem.rule and "pip install 'trivium[nolib]'" in problem.fix
    )
    (problem,) = _problems(tmp_path, ["wandb", "wandb"])
    assert problem.rule == "listed twice"


def test_builtin_trackers_name_their_library_and_extra():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for name in ("tensorboard", "wandb", "mlflow"):
        tracker = TRACKERS.get(name)
        assert tracker.extra in extras, name
        assert any(req.startswith(tracker.extra) or tracker.requires in req for req in extras["dev"]), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tensorboard_over_http(log_dir, tag: str, timeout: float = 120) -> list[tuple[int, float]]:
    """Start `tensorboard --logdir` on 127.0.0.1 and fetch ``tag``'s scalars of the run '.' over HTTP."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(log_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?" + urllib.parse.urlencode(
        {"run": ".", "tag": tag}
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    rows = json.loads(response.read())
                if rows:
                    return [(step, value) for _, step, value in rows]
            except OSError:
                pass
            assert time.monotonic() < deadline, f"tensorboard served no scalars for {tag} in {timeout} s"
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.integration
def test_killed_and_resumed_run_continues_each_tracker_run_without_duplicate_steps(
    tmp_path, tiny_model_dir, word_problem_dir
):
    steps = 4
    cfg = grpo_config(tmp_path, tiny_model_dir, word_problem_dir, "tracked", steps=steps)
    cfg["monitor"]["backends"] = ["jsonl", "tensorboard", "wandb", "mlflow"]
    path = write(tmp_path, cfg)
    # killed inside the checkpoint of step 3: its record is in metrics.jsonl and in every tracker already
    first = trivium_run(path, "checkpoint:3")
    assert first.returncode == -9, first.stderr[-3000:]
    run = run_dir(tmp_path, "tracked")
    ids = json.loads((run / "trackers.json").read_text())
    final = trivium_run(path)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming" in final.stderr and "step_2" in final.stderr
    state = json.loads((run / "trackers.json").read_text())
    assert state["wandb"]["saved"]["id"] == ids["wandb"]["saved"]["id"]
    assert state["mlflow"]["saved"]["run_id"] == ids["mlflow"]["saved"]["run_id"]

    key = "rollout/model_version"  # differs from step to step (the weights each step samples with)
    expected = [(r["global_step"], r[key]) for r in read_metrics(run) if key in r]
    assert [s for s, _ in expected] == list(range(1, steps + 1))
    assert len({v for _, v in expected}) > 1

    def check(history, what):
        got = history[key]
        assert [s for s, _ in got] == list(range(1, steps + 1)), f"{what}: {got}"  # each step once
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-5), what
        accuracy = [s for s, _ in history["eval/test/accuracy"]]
        assert (
            accuracy
            == sorted(set(accuracy))
            == [r["global_step"] for r in read_metrics(run) if "eval/test/accuracy" in r]
        ), what

    check(tensorboard_scalars(run / "tensorboard"), "tensorboard")
    history, config, sessions = wandb_run(run, state["wandb"]["saved"]["id"])
    check(history, "wandb")
    assert sessions == 2  # one offline run folder per process, both of the one run id
    assert config["main"]["trainer"]["save_interval"] == 1  # the resolved config, by stage
    history, params, mlrun = mlflow_run(
        state["mlflow"]["saved"]["tracking_uri"], state["mlflow"]["saved"]["run_id"]
    )
    check(history, "mlflow")
    assert params["main.trainer.save_interval"] == "1" and mlrun.info.status == "FINISHED"

    served = _tensorboard_over_http(run / "tensorboard", key)
    assert [s for s, _ in served] == [s for s, _ in expected]
    assert [v for _, v in served] == pytest.approx([v for _, v in expected], rel=1e-5)


def test_a_stage_cannot_change_the_runs_trackers(tmp_path):
    cfg = {
        "mode": "bench",
        "stages": [{"name": "a", "monitor": {"backends": ["tensorboard"], "progress_bar": False}}],
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cfg.yaml", check_files=False)
    (problem,) = [p for p in info.value.problems if "monitor" in p.path]
    assert problem.path == "stages[0].monitor.backends" and problem.fix == "set it at the top level"


def test_offline_files_of_a_run_opened_twice_within_one_second_come_in_order(tmp_path):
    """wandb names a process's folder by the second it opened the run: a resumed process within the same second
    gets ``-1`` appended (seen in CI: its steps were missed and the test's history ended at step 2)."""
    from trivium.monitor.wandb_files import offline_files

    names = [
        "offline-run-20261205_015501-abc",
        "offline-run-20261205_015500-abc-1",
        "offline-run-20261205_015500-abc",
        "offline-run-20261205_015500-abcd",  # another run whose id starts the same
        "offline-run-20261205_015500-abc-2",
    ]
    for name in names:
        run_id = name.split("-")[3]
        (tmp_path / "wandb" / name).mkdir(parents=True)
        (tmp_path / "wandb" / name / f"run-{run_id}.wandb").write_bytes(b"")
    assert [p.parent.name for p in offline_files(tmp_path, "abc")] == [
        "offline-run-20261205_015500-abc",
        "offline-run-20261205_015500-abc-1",
        "offline-run-20261205_015500-abc-2",
        "offline-run-20261205_015501-abc",
    ]
