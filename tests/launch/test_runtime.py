"""runtime.num_threads and the warning about another run on the same machine."""

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from trivium.launch import runtime
from trivium.launch.runtime import _is_trivium_run, apply_threads, env_threads, other_runs


@pytest.fixture(autouse=True)
def _restore_thread_env(monkeypatch):
    """apply_threads writes OMP_NUM_THREADS and RAYON_NUM_THREADS for the processes a run starts: put back
    what this test process had."""
    for key in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)


def test_num_threads_is_applied_and_said(caplog):
    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="trivium.launch.runtime"):
            assert apply_threads(1) == 1
        assert torch.get_num_threads() == 1
        assert "1 thread(s)" in caplog.text and "(runtime.num_threads)" in caplog.text
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_of_the_environment_is_the_default_and_said(caplog, monkeypatch):
    # what a job scheduler (or pytest-xdist's conftest, or a parent run) sets when the process starts
    monkeypatch.setattr(runtime, "STARTED_WITH_THREADS", 1)
    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="trivium.launch.runtime"):
            assert apply_threads(None) == 1
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        assert "(OMP_NUM_THREADS from the environment" in caplog.text
        assert "another trivium run" not in caplog.text  # a share was given: no advice to take one
        with caplog.at_level("INFO", logger="trivium.launch.runtime"):
            assert apply_threads(2) == 2  # the config's value wins
    finally:
        torch.set_num_threads(before)


def test_omp_num_threads_is_read_as_openmp_writes_it():
    assert env_threads({"OMP_NUM_THREADS": "4"}) == 4
    assert env_threads({"OMP_NUM_THREADS": " 3,1"}) == 3  # nested levels: the outer one
    for value in ("", "0", "-2", "four", "1.5"):
        assert env_threads({"OMP_NUM_THREADS": value}) is None, value
    assert env_threads({}) is None


def test_a_run_in_the_same_process_does_not_take_the_last_runs_threads_for_the_users(monkeypatch):
    monkeypatch.setattr(runtime, "STARTED_WITH_THREADS", None)
    before = torch.get_num_threads()
    try:
        apply_threads(1)  # writes OMP_NUM_THREADS=1 for the processes that run starts
        assert apply_threads(None) == (os.cpu_count() or 1)
    finally:
        torch.set_num_threads(before)


def test_another_trivium_run_is_found_and_named_in_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(runtime, "STARTED_WITH_THREADS", None)  # as on a machine without OMP_NUM_THREADS
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


def test_a_run_keeps_datasets_unimported_and_its_progress_bars_off_when_it_is():
    """`datasets` (0.7 s to import) is loaded only by runs that read a Hub dataset; its bars stay off."""
    code = (
        "import sys; from trivium.launch.run import _quiet_libraries; _quiet_libraries(); "
        "assert 'datasets' not in sys.modules, 'datasets imported'; "
        "import datasets; assert not datasets.is_progress_bar_enabled(), 'bars on'"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


HEAP_WORKER = """
import re, sys, torch
from trivium.launch.runtime import keep_freed_memory
assert keep_freed_memory(sys.argv[1] == "1") == (sys.argv[1] == "1")
x = torch.ones(16 << 20)  # 64 MiB: above glibc's largest dynamic mmap threshold (32 MiB)
where = x.data_ptr()
for line in open("/proc/self/maps"):
    start, end = (int(a, 16) for a in line.split()[0].split("-"))
    if start <= where < end:
        print("heap" if line.rstrip().endswith("[heap]") else "mmap")
"""


def test_keep_freed_memory_takes_large_blocks_from_the_heap_where_a_freed_one_is_reused():
    """runtime.keep_freed_memory: a 64 MiB tensor is a mapping of its own by default (glibc maps it on
    allocation and unmaps it on free, so the next step's faults its pages in again) and comes from the heap
    with the setting (where freed blocks stay for reuse). The speed this buys is a benchmark's
    (docs/performance.md; page-fault counts are no test here: the VM's kernel reclaims idle pages too). In a
    process of its own: the setting is process-wide."""
    if __import__("platform").libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    where = {}
    for on in ("0", "1"):
        done = subprocess.run(
            [sys.executable, "-c", HEAP_WORKER, on], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        where[on] = done.stdout.strip().splitlines()[-1]
    assert where == {"0": "mmap", "1": "heap"}


def test_keep_freed_memory_off_changes_nothing(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    assert runtime.keep_freed_memory(False) is False
    assert "MALLOC_MMAP_MAX_" not in os.environ


def test_a_run_with_keep_freed_memory_sets_it_and_says_so(e2e, tmp_path):
    """The setting reaches the run: two SFT steps of the tiny task in a process of their own log it."""
    import yaml
    from tests.launch.helpers import trivium_run

    if __import__("platform").libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    e2e.write(tmp_path)
    cfg = e2e.config(tmp_path)
    cfg["stages"] = cfg["stages"][:1]
    cfg["stages"][0]["buffer"]["total_steps"] = 2
    cfg["runtime"] = {"keep_freed_memory": True, "num_threads": 1}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = trivium_run(path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "freed blocks stay in the process for reuse (runtime.keep_freed_memory" in done.stderr
