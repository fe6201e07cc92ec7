"""Serve mode end to end: a real serve process answers requests, feedback arrives later, a real train
process trains on the rewarded calls only, and the server switches to the weights it published."""

import json
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
import yaml

from trivium.buffer.storage_sql import SqlStorage
from trivium.monitor.metrics import read_metrics

QUESTION = [{"role": "user", "content": "Tom has 12 apples and gets 3 more. How many apples now?"}]


def post(url, body):
    """``(status, JSON body)`` of a raw POST; ``body`` bytes are sent as they are."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def rows(db):
    """``{(task_id, choice): (status, reward, model_version)}`` of every row of the buffer, read with sqlite3."""
    with sqlite3.connect(db) as conn:
        found = conn.execute("SELECT task_id, status, model_version, fields FROM experiences").fetchall()
    out = {}
    for task_id, status, version, fields in found:
        f = json.loads(fields)
        out[(task_id, f["run_index"])] = (status, f["reward"], version)
    return out


def wait_for(path, alive, log=None, timeout=90):
    """The JSON of ``path`` once it exists; fails when ``alive()`` turns False or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    tail = lambda: log.read_text()[-3000:] if log is not None else ""  # noqa: E731
    while not path.exists():
        assert alive(), f"the server stopped before writing {path.name}:\n{tail()}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s:\n{tail()}"
        time.sleep(0.1)
    return json.loads(path.read_text())


@pytest.mark.integration
def test_serve_feedback_train_and_switch_weights(tmp_path, tiny_model_dir):
    cfg = {
        "project": "serve",
        "name": "live",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(tiny_model_dir)},
        "explorer": {"rollout": {"max_tokens": 6}, "eval_at_start": False},
        "monitor": {"progress_bar": False},
        "algorithm": {"algorithm_type": "reinforceplusplus"},  # a batch-wide baseline: groups of one learn
        "trainer": {"lr": 1e-3},
        "synchronizer": {"method": "checkpoint", "wait_timeout_s": 60},
        "serve": {"poll_interval_s": 0.2},
        "buffer": {
            "batch_size": 2,  # the train step takes 2 rewarded experiences (no task set: served traffic)
            "total_steps": 1,
            "storage": {"read_timeout_s": 60},
        },
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "runs" / "serve" / "live"
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set"]
    log = tmp_path / "serve.log"
    with open(log, "w") as sink:
        server = subprocess.Popen([*cmd, "mode=serve"], stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        info = wait_for(run_dir / "serve.json", lambda: server.poll() is None, log)
        client = openai.OpenAI(base_url=info["base_url"], api_key="EMPTY", max_retries=0)

        # live traffic: four calls, one of them with two choices; all recorded with the reward empty
        calls = [client.chat.completions.create(model="live", messages=QUESTION, n=n) for n in (1, 1, 2, 1)]
        ids = [c.id for c in calls]
        assert all(c.model_version == 0 for c in calls) and len(calls[2].choices) == 2
        storage = SqlStorage(run_dir / "buffer.sqlite")
        assert (storage.count("pending"), storage.count("ready")) == (5, 0)  # nothing trainable yet
        recorded = rows(run_dir / "buffer.sqlite")
        assert set(recorded) == {(i, k) for c in calls for i, k in [(c.id, ch.index) for ch in c.choices]}
        assert all(r[0] == "pending" and r[1] != r[1] for r in recorded.values())  # reward NaN

        # bad feedback: 4xx with a message, nothing changes, the server stays up
        feedback = info["feedback_url"]
        status, body = post(feedback, {"id": "chatcmpl-nope", "reward": 1.0})
        assert status == 404 and "no recorded call 'chatcmpl-nope'" in body["error"]["message"]
        status, body = post(feedback, {"id": ids[0], "reward": "good"})
        assert status == 400 and "reward: Input should be a valid number" in body["error"]["message"]
        status, body = post(feedback, {"reward": 1.0})
        assert status == 400 and body["error"]["param"] == "id"
        status, body = post(feedback, {"id": ids[2], "reward": 1.0, "choice": 2})
        assert status == 404 and body["error"]["param"] == "choice"
        assert post(feedback, b"{not json")[0] == 400
        assert get_json(f"{info['url']}/health")["status"] == "ok"
        assert storage.count("pending") == 5

        # later: feedback for call 0 (all choices) and for choice 1 of call 2 only
        assert post(feedback, {"id": ids[0], "reward": 1.0, "info": {"user": "u7"}}) == (
            200,
            {"id": ids[0], "ready": 1, "experience_ids": [1]},
        )
        status, body = post(feedback, {"id": ids[2], "reward": 0.0, "choice": 1})
        assert status == 200 and body["ready"] == 1
        status, body = post(feedback, {"id": ids[0], "reward": 0.5})  # a reward is attached once
        assert status == 409 and "already has a reward" in body["error"]["message"]
        assert (storage.count("pending"), storage.count("ready")) == (3, 2)
        storage.close()

        # a train process on the same run folder trains one step of 2: exactly the rewarded experiences
        train = subprocess.run([*cmd, "mode=train"], capture_output=True, text=True, timeout=180)
        assert train.returncode == 0, train.stderr[-3000:]
        after = rows(run_dir / "buffer.sqlite")
        consumed = {key: r[1] for key, r in after.items() if r[0] == "consumed"}
        assert consumed == {(ids[0], 0): 1.0, (ids[2], 1): 0.0}
        assert {key for key, r in after.items() if r[0] == "pending"} == {
            (ids[1], 0),
            (ids[2], 0),
            (ids[3], 0),
        }
        [step] = [r for r in read_metrics(run_dir) if r.get("role") == "train"]
        assert step["step"] == 1

        # the server picks up the version the train process published
        deadline = time.monotonic() + 30
        while (version := get_json(f"{info['url']}/health")["version"]) < 1:
            assert time.monotonic() < deadline, (
                f"the server still serves version {version}:\n{log.read_text()[-3000:]}"
            )
            time.sleep(0.1)
        assert version == 1
        new = client.chat.completions.create(model="live", messages=QUESTION)
        assert new.model_version == 1
        assert rows(run_dir / "buffer.sqlite")[(new.id, 0)][::2] == ("pending", 1)
        assert "serving weights version 1 (loaded in" in log.read_text()
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    assert not (run_dir / "serve.json").exists()

    # a restarted server starts from the newest published version and keeps the buffer
    with open(log, "w") as sink:
        server = subprocess.Popen([*cmd, "mode=serve"], stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        info = wait_for(run_dir / "serve.json", lambda: server.poll() is None, log)
        assert info["version_at_start"] == 1 and get_json(f"{info['url']}/health")["version"] == 1
        assert len(rows(run_dir / "buffer.sqlite")) == 6
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, log.read_text()[-3000:]


def serve_config(tmp_path, model_dir, **serve):
    return {
        "name": "inproc",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {"rollout": {"max_tokens": 4}},
        "synchronizer": {"method": "checkpoint"},
        "buffer": {"storage": {}},
        "serve": serve,
    }


def test_serve_config_needs_a_sql_buffer_checkpoint_sync_and_its_key(tmp_path, monkeypatch):
    from trivium.config import ConfigError
    from trivium.validation import validate_raw

    monkeypatch.delenv("TRIVIUM_TEST_KEY", raising=False)
    raw = serve_config(tmp_path, "Qwen/Qwen2.5-0.5B", api_key_env="TRIVIUM_TEST_KEY")
    raw.update(mode="serve", synchronizer={"method": "memory"}, buffer={})
    with pytest.raises(ConfigError) as error:
        validate_raw(raw, tmp_path)
    assert [p.path for p in error.value.problems] == [
        "buffer.storage",
        "synchronizer.method",
        "serve.api_key_env",
    ]
    monkeypatch.setenv("TRIVIUM_TEST_KEY", "k")
    raw.update(synchronizer={"method": "checkpoint"}, buffer={"storage": {}})
    (stage,) = validate_raw(raw, tmp_path).stages
    assert stage.config.serve.port == 0 and stage.config.serve.host == "127.0.0.1"


@pytest.mark.integration
def test_in_process_server_needs_the_key_for_feedback_and_bounds_its_sessions(
    tmp_path, tiny_model_dir, monkeypatch
):
    """serve() in a thread: /feedback is behind the API key, and the default session is replaced every
    keep_calls calls (the calls stay in the buffer)."""
    from tests.launch.helpers import serving

    from trivium.validation import validate_raw

    monkeypatch.setenv("TRIVIUM_TEST_KEY", "secret")
    raw = serve_config(tmp_path, tiny_model_dir, api_key_env="TRIVIUM_TEST_KEY", keep_calls=2)
    (stage,) = validate_raw({**raw, "mode": "serve"}, tmp_path).stages
    run_dir = tmp_path / "runs" / "trivium" / "inproc"
    run_dir.mkdir(parents=True)
    with serving(stage.config, run_dir) as info:
        client = openai.OpenAI(base_url=info["base_url"], api_key="secret", max_retries=0)
        ids = [client.chat.completions.create(model="m", messages=QUESTION).id for _ in range(3)]
        status, body = post(info["feedback_url"], {"id": ids[0], "reward": 1.0})
        assert status == 401 and "Authorization: Bearer" in body["error"]["message"]
        assert get_json(f"{info['url']}/health")["sessions"] == 1
    with sqlite3.connect(run_dir / "buffer.sqlite") as conn:
        found = conn.execute("SELECT task_id, fields FROM experiences ORDER BY id").fetchall()
    assert [t for t, _ in found] == ids
    assert [json.loads(f)["info"]["session_id"] for _, f in found] == ["default", "default", "default-2"]


def test_a_version_that_does_not_load_is_logged_once_and_the_old_one_stays_served(
    tmp_path, tiny_model_dir, caplog
):
    import logging

    import torch

    from trivium.launch.serve_mode import WeightFollower
    from trivium.models.transformers_engine import TransformersEngine
    from trivium.sync.checkpoint import CheckpointSync

    engine = TransformersEngine.from_pretrained(tiny_model_dir)
    sync = CheckpointSync(tmp_path / "sync")
    sync.publish({"not.a.weight": torch.zeros(2)}, 3)  # e.g. a train process with another model
    follower = WeightFollower(sync, engine, interval_s=0.01)
    with caplog.at_level(logging.ERROR, logger="trivium.launch.serve_mode"):
        assert follower.poll() is None and follower.poll() is None
    assert engine.version == 0
    [logged] = caplog.records  # the second failure, the same error, is not logged again
    assert "still serving version 0" in logged.message
    sync.publish(engine.state_dict(), 4)
    assert follower.poll() == 4 and engine.version == 4


@pytest.mark.integration
def test_an_absurd_feedback_reward_never_reaches_the_weights(tmp_path, tiny_model_dir):
    """The issue's case: a reward of 1e308 (finite in float64). The feedback API refuses it by default; with
    the bounds opened, the trainer drops it, trains on the rest, publishes finite weights, and the server
    loads them and keeps answering."""
    cfg = {
        "project": "serve",
        "name": "poison",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(tiny_model_dir)},
        "explorer": {"rollout": {"max_tokens": 6}, "eval_at_start": False},
        "monitor": {"progress_bar": False},
        "algorithm": {"algorithm_type": "reinforceplusplus"},
        "trainer": {"lr": 1e-3},
        "synchronizer": {"method": "checkpoint", "wait_timeout_s": 60},
        "serve": {"poll_interval_s": 0.2},
        "buffer": {"batch_size": 3, "total_steps": 1, "storage": {"read_timeout_s": 60}},
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "runs" / "serve" / "poison"
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set"]
    log = tmp_path / "serve.log"
    with open(log, "w") as sink:
        server = subprocess.Popen(
            [*cmd, "mode=serve", "--set", "serve.reward_max=1e308"], stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        info = wait_for(run_dir / "serve.json", lambda: server.poll() is None, log)
        client = openai.OpenAI(base_url=info["base_url"], api_key="EMPTY", max_retries=0)
        ids = [client.chat.completions.create(model="poison", messages=QUESTION).id for _ in range(3)]
        feedback = info["feedback_url"]
        assert post(feedback, {"id": ids[0], "reward": 1e308})[0] == 200  # bounds opened: accepted
        assert post(feedback, {"id": ids[1], "reward": 1.0})[0] == 200
        assert post(feedback, {"id": ids[2], "reward": 0.0})[0] == 200
        train = subprocess.run([*cmd, "mode=train"], capture_output=True, text=True, timeout=300)
        assert train.returncode == 0, train.stderr[-3000:]
        assert (
            "dropped 1 experience(s) whose reward is non-finite or beyond trainer.max_abs_reward"
            in train.stderr
        )
        (record,) = [r for r in read_metrics(run_dir) if r.get("role") == "train"]
        assert record["train/dropped_experiences"] == 1.0 and record["train/sequences"] == 2.0
        deadline = time.monotonic() + 60
        while get_json(f"{info['url']}/health")["weights"]["version"] != 1:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        health = get_json(f"{info['url']}/health")
        assert health["status"] == "ok" and health["weights"]["healthy"] is True
        again = client.chat.completions.create(model="poison", messages=QUESTION)
        assert again.model_version == 1 and again.choices[0].message.content is not None
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def test_feedback_refuses_an_absurd_reward_by_default(tmp_path):
    from trivium.config.schema import ServeConfig

    assert ServeConfig().reward_max == 1e6 and ServeConfig().reward_min == -1e6
