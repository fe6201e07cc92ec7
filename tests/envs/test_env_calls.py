"""Environment calls over their time limit: the episode fails at once, and the call's thread is stopped
where Python can stop it (envs/calls.py); where it cannot, the thread is listed and blocks nothing."""

import contextlib
import subprocess
import sys
import threading
import time

import pytest

from trivium import faults
from trivium.envs.calls import EnvTimeoutError, call_with_timeout, hung_calls
from trivium.faults import FaultInjector, FaultRates


def _threads(prefix):
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def _wait_until(condition, seconds=5.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_call_looping_in_python_is_stopped_after_its_timeout():
    stopped = threading.Event()

    def spin():
        try:
            while True:  # a simulator that never converges
                time.sleep(0.01)
        finally:
            stopped.set()

    t0 = time.monotonic()
    with pytest.raises(EnvTimeoutError, match=r"loop\.step did not return within env_timeout_s=0.2"):
        call_with_timeout(spin, timeout_s=0.2, what="loop.step")
    assert time.monotonic() - t0 < 1.0
    assert stopped.wait(2.0), "the overrunning call's thread was not stopped"
    assert _wait_until(lambda: not _threads("env-loop.step"))
    assert not [w for w, _ in hung_calls() if w == "loop.step"]


def test_except_exception_in_the_environment_does_not_swallow_the_stop():
    def stubborn():
        while True:
            with contextlib.suppress(Exception):  # environment code that catches everything it knows of
                time.sleep(0.01)

    with pytest.raises(EnvTimeoutError):
        call_with_timeout(stubborn, timeout_s=0.1, what="stubborn.step")
    assert _wait_until(lambda: not _threads("env-stubborn.step"))


def test_a_call_blocked_in_c_runs_on_listed_until_it_returns_and_close_can_end_it():
    """A child process read without a timeout: the thread sees the stop only when the read returns, so
    it is listed by hung_calls; killing the process (what close() of such an environment does) ends it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        with pytest.raises(EnvTimeoutError):
            call_with_timeout(child.stdout.read, timeout_s=0.2, what="pipe.step")
        time.sleep(0.3)
        assert _threads("env-pipe.step"), "a thread blocked in a C call cannot be interrupted"
        assert [w for w, _ in hung_calls() if w == "pipe.step"] == ["pipe.step"]
        child.kill()  # the environment's close()
        assert _wait_until(lambda: not _threads("env-pipe.step"))
        assert "pipe.step" not in [w for w, _ in hung_calls()]
    finally:
        child.kill()
        child.wait()


def test_injected_environment_faults_raise_or_hang_until_the_timeout_stops_them():
    injector = FaultInjector(FaultRates(env_hang=1.0))
    with injector.scope("explore:1|0|t|0"), pytest.raises(EnvTimeoutError, match="an injected hang"):
        call_with_timeout(lambda: "obs", timeout_s=0.2, what="grid.reset", fault_site="env")
    assert _wait_until(lambda: not _threads("env-grid.reset"))  # the hang sleeps in slices: it stops
    injector = FaultInjector(FaultRates(env_raise=1.0))
    with injector.scope("k"), pytest.raises(faults.InjectedFault, match=r"env_raise at env grid\.step"):
        call_with_timeout(lambda: "obs", timeout_s=0.2, what="grid.step", fault_site="env")
    assert call_with_timeout(lambda: "obs", timeout_s=0.2, what="grid.step", fault_site="env") == "obs"


def test_the_fault_scope_reaches_a_reward_computed_inside_an_environment_call():
    """The tool environment scores the final answer inside step(), i.e. in the helper thread."""
    injector = FaultInjector(FaultRates(reward_raise=1.0))
    with injector.scope("k") as scope, pytest.raises(faults.InjectedFault, match="reward_raise"):
        call_with_timeout(lambda: faults.at("reward", "math_verify"), timeout_s=1.0, what="tools.step")
    assert scope.injected == ["reward_raise"]
