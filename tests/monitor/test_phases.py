"""The step profile: phases add up, idle is what the busy parts leave."""

import time

import pytest

from trivium.monitor.phases import PhaseTimer, close_step


def test_phases_add_up_their_repeats():
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
