"""An explore process and a train process on one run folder: SQLite buffer and checkpoint weight sync."""

import subprocess
import sys
import time

import pytest
import yaml

from trivium.buffer.storage_sql import SqlStorage
from trivium.monitor.metrics import read_metrics


def pair_config(tmp_path, model_dir, data_dir, name, *, total_steps, synchronizer, eval_tasksets=(), **top):
    """The config both processes share (its path), differing per test in name, steps, sync and extras."""
    cfg = {
        "project": "decoupled",
        "name": name,
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {
            "rollout": {"max_tokens": 6},
            "eval_interval": 2 if eval_tasksets else 0,
            "eval_at_start": False,
        },
        "monitor": {"progress_bar": False},
        "synchronizer": {"wait_timeout_s": 120, **synchronizer},
        "buffer": {
            "batch_size": 2,
            "total_steps": total_steps,
            "storage": {"read_timeout_s": 120},
            "taskset": {"path": str(data_dir / "train.jsonl"), "repeat_times": 3},
            "eval_tasksets": list(eval_tasksets),
        },
        **top,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.integration
def test_explore_and_train_processes_learn_together(tmp_path, tiny_model_dir, word_problem_dir):
    test = {"path": str(word_problem_dir / "test.jsonl"), "name": "test", "max_rows": 4}
    path = pair_config(
        tmp_path,
        tiny_model_dir,
        word_problem_dir,
        "pair",
        total_steps=4,
        synchronizer={"method": "checkpoint", "sync_interval": 1},
        eval_tasksets=[test],
    )
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set"]
    explore = subprocess.Popen([*cmd, "mode=explore"], stderr=subprocess.PIPE, text=True)
    train = subprocess.run([*cmd, "mode=train"], capture_output=True, text=True, timeout=300)
    _, explore_err = explore.communicate(timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    assert explore.returncode == 0, explore_err[-3000:]

    run_dir = tmp_path / "runs" / "decoupled" / "pair"
    records = read_metrics(run_dir)
    explore_steps = [r for r in records if r.get("role") == "explore"]
    train_steps = [r for r in records if r.get("role") == "train"]
    assert [r["step"] for r in explore_steps] == [1, 2, 3, 4]
    assert [r["step"] for r in train_steps] == [1, 2, 3, 4]
    # strictly on-policy across processes: explore step s sampled with the weights of train step s - 1
    assert [r["rollout/model_version"] for r in explore_steps] == [0, 1, 2, 3]
    assert all(r["staleness/max"] == 0 for r in train_steps)
    storage = SqlStorage(run_dir / "buffer.sqlite")
    assert storage.count("consumed") == 4 * 2 * 3 and storage.count("ready") == 0  # each trained once
    storage.close()
    assert any("eval/test/accuracy" in r for r in explore_steps)


@pytest.mark.integration
def test_a_train_process_asking_for_more_steps_than_its_explore_process_writes_stops_at_once(
    tmp_path, tiny_model_dir, word_problem_dir
):
    """The explore process writes 1 step and finishes; the train process, told 2, trains the first and then
    fails on the explore process's heartbeat, naming both counts, instead of waiting out read_timeout_s."""
    path = pair_config(
        tmp_path, tiny_model_dir, word_problem_dir, "short", total_steps=2, synchronizer={"method": "memory"}
    )
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set"]
    explore = subprocess.Popen(
        [*cmd, "mode=explore", "--set", "buffer.total_steps=1"], stderr=subprocess.PIPE, text=True
    )
    started = time.monotonic()
    train = subprocess.run([*cmd, "mode=train"], capture_output=True, text=True, timeout=300)
    waited = time.monotonic() - started
    _, explore_err = explore.communicate(timeout=300)
    assert explore.returncode == 0, explore_err[-3000:]
    assert train.returncode != 0
    assert "finished after writing step 1 of 1" in train.stderr, train.stderr[-3000:]
    assert waited < 100  # read_timeout_s is 120
    records = read_metrics(tmp_path / "runs" / "decoupled" / "short")
    assert [r["step"] for r in records if r.get("role") == "train"] == [1]


@pytest.mark.integration
def test_killed_explore_and_train_processes_resume_exactly_once(tmp_path, tiny_model_dir, word_problem_dir):
    """Each process killed after it wrote records past its last checkpoint: the restarted process drops
    them and writes them again, so every step has exactly one record and the plot never goes back."""
    import os

    from trivium.monitor.plot import plot_run

    path = pair_config(
        tmp_path,
        tiny_model_dir,
        word_problem_dir,
        "crash",
        total_steps=6,
        synchronizer={"method": "checkpoint", "sync_interval": 1},
        trainer={"save_interval": 2},
    )

    def start(mode, kill_at=""):
        env = {**os.environ, "TRIVIUM_KILL_AT": kill_at}
        return subprocess.Popen(
            [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set", f"mode={mode}"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )

    explore, train = start("explore", "explore:5"), start("train", "train:4")
    # killed while training step 4: steps 1-3 have records, the newest checkpoint is step 2's
    _, train_err = train.communicate(timeout=300)
    assert train.returncode == -9, train_err[-3000:]
    train = start("train")  # restarted while the explorer waits for weights version 4
    assert explore.wait(timeout=300) == -9  # killed after sampling step 5, before its record
    explore = start("explore")
    _, train_err = train.communicate(timeout=300)
    _, explore_err = explore.communicate(timeout=300)
    assert train.returncode == 0, train_err[-3000:]
    assert explore.returncode == 0, explore_err[-3000:]
    assert "resuming from" in train_err and "step_2" in train_err and "1 metric record(s)" in train_err
    assert "explore process resumes after step 4" in explore_err

    run_dir = tmp_path / "runs" / "decoupled" / "crash"
    storage = SqlStorage(run_dir / "buffer.sqlite")
    assert storage.count() == 6 * 2 * 3  # the re-run explore step 5 stored nothing twice
    assert storage.count("consumed") == 6 * 2 * 3  # every experience trained exactly once
    storage.close()
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if r.get("role") == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if r.get("role") == "explore"] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in run_dir.glob("metrics*.jsonl")) == [
        "metrics.explore.jsonl",
        "metrics.train.jsonl",
    ]
    plot_run(run_dir)


@pytest.mark.integration
@pytest.mark.parametrize("rollout_dtype", [None, "bfloat16"], ids=["fp32", "bf16-engine"])
def test_collective_weight_sync_over_gloo_between_two_processes(
    tmp_path, tiny_model_dir, word_problem_dir, rollout_dtype
):
    """With a bf16 engine (explorer.rollout.dtype) the fp32 trainer sends its weights cast to bf16 (the
    receiver's buffers are bf16), and the receiver's checksum check passes on what it loaded."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = pair_config(
        tmp_path,
        tiny_model_dir,
        word_problem_dir,
        "gloo",
        total_steps=5,
        synchronizer={
            "method": "collective",
            "collective_init": f"tcp://127.0.0.1:{port}",
            "sync_interval": 2,
        },
    )
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--set"]
    if rollout_dtype:
        cmd = [*cmd, f"explorer.rollout.dtype={rollout_dtype}", "--set"]
    explore = subprocess.Popen([*cmd, "mode=explore"], stderr=subprocess.PIPE, text=True)
    train = subprocess.run([*cmd, "mode=train"], capture_output=True, text=True, timeout=300)
    _, explore_err = explore.communicate(timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    assert explore.returncode == 0, explore_err[-3000:]
    records = read_metrics(tmp_path / "runs" / "decoupled" / "gloo")
    versions = [r["rollout/model_version"] for r in records if r.get("role") == "explore"]
    assert versions == [0, 0, 2, 2, 4]  # k = 2: explore step s samples with version 2 * floor((s - 1) / 2)
