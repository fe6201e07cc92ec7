"""A decoupled train process reads its explore process's heartbeat while it waits for a batch: it stops
waiting at once when that process has finished, and says at once when it failed or went silent."""

import json
import logging
import time

import pytest
import torch

import trivium.launch.explore_heartbeat as hb
from trivium.buffer.feed import StorageFeed
from trivium.buffer.storage_sql import SqlStorage
from trivium.launch.explore_heartbeat import ExploreProcessFinished, ExploreWatch, Heartbeat, heartbeat_path
from trivium.types import Experience


@pytest.fixture(autouse=True)
def fast_beats(monkeypatch):
    monkeypatch.setattr(hb, "HEARTBEAT_S", 0.05)


def experience(step: int) -> Experience:
    """One experience of explore step ``step`` (what it holds does not matter here)."""
    mask = torch.ones(2, dtype=torch.bool)
    return Experience(torch.tensor([1, 2, 3]), 1, mask, torch.zeros(2), reward=1.0, explore_step=step)


def test_a_train_process_stops_waiting_once_its_explore_process_has_finished(tmp_path):
    path = heartbeat_path(tmp_path, "grpo")
    feed = StorageFeed(
        SqlStorage(tmp_path / "buffer.sqlite"), timeout_s=60, waiting=ExploreWatch(path, "grpo")
    )
    beat = Heartbeat(path, 0, 2)
    beat.start()
    feed.put([experience(1)])
    beat.wrote(1)
    beat.finish()
    assert len(feed.take(1, step=1)) == 1  # what was written before it finished is still read
    started = time.monotonic()
    with pytest.raises(ExploreProcessFinished, match=r"finished after writing step 1 of 2.*same config"):
        feed.take(1, step=2)
    assert time.monotonic() - started < 10  # not the 60 s read timeout
    feed.close()


def test_a_step_written_just_before_the_finish_is_read(tmp_path):
    """The watch fails on its second look at a 'finished': a read tried after the change comes first."""
    path = heartbeat_path(tmp_path, "grpo")
    watch = ExploreWatch(path, "grpo")
    beat = Heartbeat(path, 0, 1)
    beat.start()
    beat.finish()
    watch()  # first look: no error yet
    time.sleep(0.06)
    with pytest.raises(ExploreProcessFinished):
        watch()


def test_an_earlier_runs_finished_heartbeat_counts_for_nothing(tmp_path):
    """Written before this process started: a folder reused by a new run, whose explore process may be about
    to start again with more steps."""
    path = heartbeat_path(tmp_path, "grpo")
    record = {"state": "finished", "host": "h", "pid": 7, "step": 1, "total": 1, "error": None}
    path.write_text(json.dumps({**record, "beat": hb.process_started() - 5}))
    watch = ExploreWatch(path, "grpo")
    for _ in range(3):
        watch()
        time.sleep(0.06)
    assert "is finished" in watch.describe()


def test_a_failed_explore_process_is_reported_at_once_and_in_the_timeout(tmp_path, caplog):
    path = heartbeat_path(tmp_path, "grpo")
    beat = Heartbeat(path, 3, 10)
    beat.start()
    beat.fail(RuntimeError("CUDA out of memory"))
    assert json.loads(path.read_text())["state"] == "failed"
    feed = StorageFeed(
        SqlStorage(tmp_path / "buffer.sqlite"), timeout_s=0.5, waiting=ExploreWatch(path, "grpo")
    )
    with (
        caplog.at_level(logging.WARNING, logger=hb.__name__),
        pytest.raises(TimeoutError, match=r"failed after writing step 3: RuntimeError: CUDA out of memory"),
    ):
        feed.take(1, step=4)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once, not at every look
    assert "Restart it" in warnings[0] and "continues after step 3" in warnings[0]
    feed.close()


def test_an_explore_process_that_stopped_beating_is_taken_for_gone(tmp_path, caplog):
    path = heartbeat_path(tmp_path, "grpo")
    record = {"state": "running", "host": "h", "pid": 7, "step": 5, "total": 9, "error": None}
    path.write_text(json.dumps({**record, "beat": time.time() - 2 * hb.STALE_S}))
    with caplog.at_level(logging.WARNING, logger=hb.__name__):
        ExploreWatch(path, "grpo")()
    assert "has sent no heartbeat for" in caplog.text and "killed" in caplog.text


def test_a_running_explore_process_beats(tmp_path):
    path = heartbeat_path(tmp_path, "grpo")
    beat = Heartbeat(path, 0, 4)
    beat.start()
    first = json.loads(path.read_text())["beat"]
    beat.wrote(2)
    time.sleep(0.3)
    now = json.loads(path.read_text())
    assert now["beat"] > first and now["step"] == 2 and now["state"] == "running"
    assert ExploreWatch(path, "grpo").gone(now) is None
    beat.finish()
    assert json.loads(path.read_text())["state"] == "finished"


def test_without_a_heartbeat_the_read_waits_as_before(tmp_path):
    watch = ExploreWatch(heartbeat_path(tmp_path, "grpo"), "grpo")
    feed = StorageFeed(SqlStorage(tmp_path / "buffer.sqlite"), timeout_s=0.3, waiting=watch)
    with pytest.raises(TimeoutError, match="no explore process heartbeat"):
        feed.take(1, step=1)
    feed.close()
