"""runtime.num_threads and the warning about another run on the same machine."""

import re
import subprocess
import sys
import time

import torch

from trivium.launch.runtime import _is_trivium_run, apply_threads, other_runs


def test_num_threads_is_applied_and_said(caplog):
    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="trivium.launch.runtime"):
            assert apply_threads(1) == 1
        assert torch.get_num_threads() == 1
        assert "1 thread(s)" in caplog.text and "(runtime.num_threads)" in caplog.text
    finally:
        torch.set_num_threads(before)


def test_another_trivium_run_is_found_and_named_in_a_warning(caplog):
    # a stand-in whose command line reads like `trivium run ...` (it only sleeps)
    code = "import time; time.sleep(30)"
    other = subprocess.Popen([sys.executable, "-c", code, "trivium", "run", "-c", "x.yaml"])
    before = torch.get_num_threads()
    try:
        deadline = time.monotonic() + 10
        while other.pid not in other_runs() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.pid in other_runs()
        with caplog.at_level("WARNING", logger="trivium.launch.runtime"):
            apply_threads(None)
        # the machine may run real trivium runs too (a user's, CI's): the stand-in is one of the pids named
        named = re.search(r"another trivium run is on this machine \(pid ([\d, ]+)\)", caplog.text)
        assert named, caplog.text
        assert str(other.pid) in named.group(1).split(", ") or len(other_runs()) > 5, caplog.text
        assert "runtime.num_threads=" in caplog.text
    finally:
        other.kill()
        other.wait()
        torch.set_num_threads(before)


def test_what_counts_as_a_trivium_run():
    assert _is_trivium_run(["/venv/bin/trivium", "run", "-c", "a.yaml"])
    assert _is_trivium_run(["python", "-m", "trivium.cli", "run", "-c", "a.yaml"])
    assert not _is_trivium_run(["python", "-m", "trivium.launch.rank", "--rank", "1"])
    assert not _is_trivium_run(["/venv/bin/trivium", "check-config", "run.yaml"])
