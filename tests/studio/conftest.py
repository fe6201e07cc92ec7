"""A real Studio server on 127.0.0.1 (uvicorn in a thread) over a runs root and a config folder holding the
end-to-end tests' tiny task (tests/launch/conftest.py): SFT for a few steps, then GRPO."""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml
from tests.launch.conftest import config, write_task

from trivium.studio.app import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Studio:
    def __init__(self, root, configs, token=None, **options):
        self.root, self.configs, self.token = root, configs, token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(root, [configs], token, **options)
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "Studio did not start"
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.url, timeout=60, headers=headers)
        return self

    def __exit__(self, *exc):
        self.http.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)


def tiny_run_config(folder, name="tiny", sft_steps=4, grpo_steps=3):
    """The tiny task's data and a two-stage config in ``folder``; returns the config path."""
    write_task(folder)
    cfg = config(folder, grpo_steps=grpo_steps)
    cfg["name"] = name
    cfg["stages"][0]["buffer"]["total_steps"] = sft_steps
    cfg["checkpoint_root"] = "runs"
    cfg["monitor"]["trajectories"] = {"every": 2, "per_step": 8}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart"


def quickstart_config(folder):
    """The quickstart's config and data, unchanged, copied into ``folder``; returns the config path."""
    shutil.copytree(QUICKSTART / "data", folder / "data")
    path = folder / "grpo_word_problems.yaml"
    shutil.copyfile(QUICKSTART / "grpo_word_problems.yaml", path)
    return path


@pytest.fixture
def studio(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    with Studio(tmp_path / "runs", configs) as s:
        yield s


def wait_for(predicate, timeout=240, every=0.3, what="the condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


QUESTION = [{"role": "user", "content": "Tom has 12 apples and gets 3 more. How many apples now?"}]


@contextmanager
def serving_run(studio, model_dir, folder):
    """A serve-mode run ``serve/live`` under Studio's root (a real `trivium run` process: calls recorded as
    pending experiences in its buffer.sqlite, rewards in [-1, 1]); yields its serve.json, then stops it."""
    cfg = {
        "project": "serve",
        "name": "live",
        "mode": "serve",
        "checkpoint_root": str(studio.root),
        "model": {"path": str(model_dir)},
        "explorer": {"rollout": {"max_tokens": 6}},
        "monitor": {"progress_bar": False},
        "synchronizer": {"method": "checkpoint"},
        "buffer": {"storage": {}},  # buffer.sqlite in the run folder
        "serve": {"reward_min": -1.0, "reward_max": 1.0},
    }
    (folder / "serve.yaml").write_text(yaml.safe_dump(cfg))
    run_dir, log = studio.root / "serve" / "live", folder / "serve.log"
    with open(log, "w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "trivium.cli", "run", "-c", str(folder / "serve.yaml")],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while not (run_dir / "serve.json").exists():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield json.loads((run_dir / "serve.json").read_text())
    finally:
        server.terminate()
        server.wait(timeout=30)
