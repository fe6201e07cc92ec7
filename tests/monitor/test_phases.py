"""The step profile: phases add up, idle is what the busy parts leave."""

import threading
import time

import pytest
import torch

from trivium.monitor.phases import PEAK_RSS, PeakRss, PhaseTimer, close_step


@pytest.fixture
def phase_memory():
    """Per-phase peaks on for one test (process-wide state: off again afterwards)."""
    if not PEAK_RSS.enable(True):
        pytest.skip("no writable /proc/self/clear_refs here")
    try:
        yield PEAK_RSS
    finally:
        PEAK_RSS.enable(False)


def test_phases_add_up_their_repeats():
    PEAK_RSS.enable(False)  # the default: time only
    timer = PhaseTimer()
    for _ in range(3):
        with timer("a"):
            time.sleep(0.01)
    with timer("b"):
        pass
    m = timer.metrics()
    assert set(m) == {"time/a", "time/b"}
    assert 0.03 <= m["time/a"] < 1.0
    assert m["time/b"] < m["time/a"]


def test_a_phase_that_raises_is_still_counted():
    timer = PhaseTimer()
    with pytest.raises(ValueError), timer("x"):
        raise ValueError
    assert "time/x" in timer.metrics()


def test_idle_is_the_step_minus_its_busy_parts():
    # the batch took 4 s, of which 3 s waiting for the explorer thread; train 2, sync 0.5, eval 1
    record = {"time/wait": 3.0, "time/train": 2.0, "time/sync": 0.5, "time/eval": 1.0}
    close_step(record, step_seconds=8.0, source_seconds=4.0)
    busy = (4.0 - 3.0) + 2.0 + 0.5 + 1.0
    assert record["time/step"] == 8.0
    assert record["time/idle"] == pytest.approx(8.0 - busy)
    inline = {"time/train": 2.0}  # an inline rollout: the whole batch time is busy
    close_step(inline, step_seconds=5.0, source_seconds=3.0)
    assert inline["time/idle"] == pytest.approx(0.0)


def test_each_phase_logs_the_peak_memory_of_its_own_span(phase_memory):
    timer = PhaseTimer()
    with timer("outer"):
        with timer("big"):
            block = torch.ones(50_000_000)  # 200 MB, touched
            del block
        with timer("small"):
            small = torch.ones(1000)
            del small
    m = timer.metrics()
    assert {"rss/outer", "rss/big", "rss/small"} <= set(m)
    assert m["rss/big"] > m["rss/small"] + 150  # the big block is the big phase's alone
    assert m["rss/outer"] >= m["rss/big"]  # a phase covers the phases nested in it
    assert phase_memory.process_peak() >= m["rss/big"]  # and the process's peak covers every phase


def test_concurrent_phases_each_see_the_peak_while_they_ran(phase_memory):
    """An explorer thread and the trainer: a reset by one phase's start must not hide the other's peak."""
    record: dict = {}
    started, release = threading.Event(), threading.Event()

    def other_thread():
        with phase_memory.phase(record, "long"):
            block = torch.ones(50_000_000)
            del block
            started.set()
            release.wait(10)

    t = threading.Thread(target=other_thread)
    t.start()
    started.wait(10)
    with phase_memory.phase(record, "short"):  # starts after the big block was freed: resets the mark
        pass
    release.set()
    t.join()
    assert record["rss/long"] > record["rss/short"] + 150


def test_phase_memory_off_measures_nothing():
    peaks = PeakRss()  # off until enabled
    record: dict = {}
    with peaks.phase(record, "x"):
        pass
    assert record == {} and peaks.start() is None
