import threading
import time

import pytest
import torch

from trivium.buffer import ExperienceQueue, QueueClosed
from trivium.types import Experience


def exps(n, start=0):
    return [
        Experience(
            tokens=torch.tensor([1, 2, 3]),
            prompt_length=1,
            action_mask=torch.ones(2, dtype=torch.bool),
            logprobs=torch.zeros(2),
            task_id=f"t:{start + i}",
        )
        for i in range(n)
    ]


def run_in_thread(fn):
    result = {}

    def target():
        try:
            result["value"] = fn()
        except Exception as error:
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_fifo_and_counters():
    q = ExperienceQueue(capacity=8)
    q.put(exps(3))
    q.put(exps(2, start=3))
    assert len(q) == 5
    assert [e.task_id for e in q.get(4)] == ["t:0", "t:1", "t:2", "t:3"]
    assert (len(q), q.total_put, q.total_got) == (1, 5, 4)


def test_put_blocks_when_full_until_a_consumer_gets():
    q = ExperienceQueue(capacity=4)
    q.put(exps(3))
    thread, result = run_in_thread(lambda: q.put(exps(2, start=3)))  # 3 + 2 > 4: waits, all or nothing
    time.sleep(0.1)
    assert thread.is_alive() and len(q) == 3
    assert [e.task_id for e in q.get(2)] == ["t:0", "t:1"]
    thread.join(timeout=2)
    assert not thread.is_alive() and "error" not in result
    assert [e.task_id for e in q.get(3)] == ["t:2", "t:3", "t:4"]
    assert q.put_blocked_s >= 0.05


def test_get_blocks_until_enough_arrive():
    q = ExperienceQueue(capacity=8)
    thread, result = run_in_thread(lambda: q.get(4, timeout=5))
    for i in range(4):
        time.sleep(0.02)
        q.put(exps(1, start=i))
    thread.join(timeout=2)
    assert [e.task_id for e in result["value"]] == ["t:0", "t:1", "t:2", "t:3"]


def test_get_timeout_says_what_is_there_and_why():
    q = ExperienceQueue(capacity=8)
    q.put(exps(3))
    with pytest.raises(TimeoutError) as info:
        q.get(5, timeout=0.05)
    message = str(info.value)
    assert "get(n=5) timed out after 0.05 s with 3 queued (put 3, got 0 so far)" in message
    assert "explorer produced fewer experiences than the trainer asks for" in message
    assert len(q) == 3  # nothing was taken


def test_put_timeout():
    q = ExperienceQueue(capacity=2)
    q.put(exps(2))
    with pytest.raises(TimeoutError, match="2 of 2 slots are full"):
        q.put(exps(1), timeout=0.05)


def test_close_wakes_waiters():
    q = ExperienceQueue(capacity=4)
    q.put(exps(2))
    getter, got = run_in_thread(lambda: q.get(3))
    time.sleep(0.05)
    q.close()
    getter.join(timeout=2)
    assert isinstance(got["error"], QueueClosed)
    assert "closed with only 2 queued (put 2, got 0 so far)" in str(got["error"])
    assert len(q.get(2)) == 2  # what is there can still be drained
    with pytest.raises(QueueClosed, match="the queue is closed"):
        q.put(exps(1))


def test_close_wakes_a_blocked_producer():
    q = ExperienceQueue(capacity=1)
    q.put(exps(1))
    putter, result = run_in_thread(lambda: q.put(exps(1)))
    time.sleep(0.05)
    q.close()
    putter.join(timeout=2)
    assert isinstance(result["error"], QueueClosed)


def test_oversize_put_goes_in_once_the_queue_is_empty():
    q = ExperienceQueue(capacity=4)
    q.put(exps(1))
    thread, result = run_in_thread(lambda: q.put(exps(6, start=1)))
    time.sleep(0.05)
    assert thread.is_alive()
    q.get(1)
    thread.join(timeout=2)
    assert "error" not in result and len(q) == 6
    assert len(q.get(4)) == 4


def test_bad_sizes():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ExperienceQueue(0)
    with pytest.raises(ValueError, match="n must be >= 1"):
        ExperienceQueue(4).get(0)


def test_a_step_larger_than_the_capacity_passes_whole():
    q = ExperienceQueue(capacity=4)
    q.put(exps(6))  # one step of a step-wise workflow: more experiences than runs
    assert [e.task_id for e in q.get(6)] == [f"t:{i}" for i in range(6)]
