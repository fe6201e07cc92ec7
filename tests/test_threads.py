"""threads.call_in_helper: calls in kept helper threads that the caller may stop waiting for (environment
steps and rewards under a time limit)."""

import contextvars
import multiprocessing
import threading
import time

import pytest

from trivium import threads
from trivium.threads import EnvStopped, call_in_helper, map_in_helpers

WHO = contextvars.ContextVar("who", default="nobody")


def _idle() -> list[threading.Thread]:
    with threads._LOCK:
        return list(threads._IDLE)


def test_a_helper_thread_is_reused_and_named_by_its_call():
    first = call_in_helper(
        lambda: (threading.current_thread(), threading.current_thread().name), name="env-a"
    )
    assert first.wait(5)
    thread, name = first.result()
    assert name == "env-a" and thread in _idle() and thread.name == "helper-idle"
    second = call_in_helper(lambda: threading.current_thread(), name="reward-b")
    assert second.wait(5) and second.result() is thread  # no new thread for the next call


def test_the_result_the_exception_and_the_callers_context_reach_the_caller():
    WHO.set("caller")
    call = call_in_helper(lambda a, b: (a + b, WHO.get()), 2, 3, name="t")
    assert call.wait(5) and call.result() == (5, "caller")
    failing = call_in_helper(lambda: 1 / 0, name="t")
    assert failing.wait(5)
    with pytest.raises(ZeroDivisionError):
        failing.result()
    running = call_in_helper(time.sleep, 0.5, name="t")
    with pytest.raises(RuntimeError, match="before the call finished"):
        running.result()
    assert running.wait(5) and running.result() is None


def test_a_stopped_call_ends_and_its_thread_takes_no_other_call():
    stopped_inside = threading.Event()

    def spin():
        try:
            while True:  # Python bytecode: the stop is delivered here
                pass
        except EnvStopped:
            stopped_inside.set()
            raise

    call = call_in_helper(spin, name="env-spin")
    assert not call.wait(0.2) and not call.finished
    thread = call.thread
    assert call.stop()
    assert stopped_inside.wait(5)
    thread.join(5)
    assert not thread.is_alive() and thread not in _idle()
    nxt = call_in_helper(threading.current_thread, name="t")
    assert nxt.wait(5) and nxt.result() is not thread


def test_stopping_a_call_that_finished_keeps_its_result():
    call = call_in_helper(lambda: 42, name="t")
    assert call.wait(5)
    assert call.stop() is False and call.result() == 42
    assert call.thread in _idle()  # still reused


def test_calls_at_once_run_at_once_and_idle_helpers_are_capped(monkeypatch):
    monkeypatch.setattr(threads, "IDLE_HELPERS_MAX", 2)
    monkeypatch.setattr(threads, "_IDLE", [])  # none kept from earlier tests: five new threads
    together = threading.Barrier(6)  # five calls and this thread: each call must have a thread of its own
    calls = [call_in_helper(together.wait, 5, name=f"t{i}") for i in range(5)]
    together.wait(5)
    assert all(c.wait(5) for c in calls)
    assert len({c.thread for c in calls}) == 5
    assert len(_idle()) == 2 and set(_idle()) <= {c.thread for c in calls}


def _in_child(out):
    call = call_in_helper(lambda: "child", name="t")
    out.put(call.result() if call.wait(5) else "hung")


def test_a_forked_child_starts_its_own_helpers():
    warm = call_in_helper(lambda: None, name="t")  # an idle helper in the parent, absent in a child
    assert warm.wait(5) and _idle()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(out,))
    child.start()
    try:
        assert out.get(timeout=30) == "child"
    finally:
        child.join(10)


def test_map_in_helpers_runs_at_most_workers_at_once_taking_items_in_order():
    running, most, started = 0, 0, []
    lock = threading.Lock()

    def work(item):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            started.append(item)
        time.sleep(0.02)
        with lock:
            running -= 1
        if item == 5:
            raise ValueError("item 5")
        return item * 10

    futures, join = map_in_helpers(work, list(range(12)), workers=3, name="workflow")
    join()
    assert all(f.done() for f in futures) and most == 3
    assert started[:3] == [0, 1, 2] and sorted(started) == list(range(12))
    assert [f.result() for i, f in enumerate(futures) if i != 5] == [i * 10 for i in range(12) if i != 5]
    with pytest.raises(ValueError, match="item 5"):
        futures[5].result()
    _, join = map_in_helpers(lambda i: started.append(("seq", i)), list(range(4)), workers=1, name="w")
    join()
    assert [x for x in started if isinstance(x, tuple)] == [("seq", i) for i in range(4)]
    assert map_in_helpers(work, [], workers=4, name="w")[0] == []
