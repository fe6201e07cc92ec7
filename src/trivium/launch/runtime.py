"""How a run uses the machine's CPU: its thread count, and a warning when another run shares the cores.

PyTorch's CPU kernels run on an OpenMP team as large as the machine. Two processes that each take every
core do not share well: their threads spin waiting for each other, and a run on 2 cores went from 0.20 s to
5.7 s per SFT step with a second one beside it. ``runtime.num_threads`` sets this process's team (and,
through ``OMP_NUM_THREADS``, that of the processes it starts: trainer ranks, vLLM); at start the run says
how many threads it uses and warns when another Trivium run is on the machine without a limit set.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

__all__ = ["apply_threads", "keep_freed_memory", "other_runs"]


def apply_threads(num_threads: int | None) -> int:
    """Set this process's CPU threads (None: ``OMP_NUM_THREADS`` when the environment sets it, as a job
    scheduler or a parent process does, else every core); returns the number used."""
    cores = os.cpu_count() or 1
    inherited = STARTED_WITH_THREADS
    threads = num_threads or inherited or cores
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for the processes this one starts
    # Intel MKL's reproducibility conditions: a fixed thread team, no run-time adjustment of its size.
    # MKL reads these when it first runs (after this), so the same seed gives the same bits run to run.
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")
    os.environ.setdefault("OMP_DYNAMIC", "FALSE")
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the Rust tokenizer's pool
    if num_threads:
        how = "runtime.num_threads"
    elif inherited:
        how = "OMP_NUM_THREADS from the environment; runtime.num_threads overrides it"
    else:
        how = "every core; set runtime.num_threads to use fewer"
    log.info("CPU: %d thread(s) of %d core(s) (%s)", threads, cores, how)
    others = other_runs()
    if others and num_threads is None and inherited is None:
        pids = ", ".join(str(pid) for pid in others[:5])
        log.warning(
            "another trivium run is on this machine (pid %s) and this one takes every core: the two slow each "
            "other down many times over. Give each run a share of the %d cores, e.g. --set "
            "runtime.num_threads=%d (docs/sharing.md)",
            pids,
            cores,
            max(1, cores // (len(others) + 1)),
        )
    return threads


# glibc's mallopt parameters (malloc.h) and what runtime.keep_freed_memory sets them to: no block from mmap
# (every block comes from the heap, where a freed one is reused), and the heap's free top returned to the
# kernel only beyond 2 GiB (mallopt takes a C int)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
KEEP_FREED = {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": 2**31 - 1}


def keep_freed_memory(on: bool) -> bool:
    """``runtime.keep_freed_memory``: where ``on``, set glibc's malloc to keep freed memory in this process
    (``KEEP_FREED``; and, through the environment, in the processes it starts). Returns whether it is set;
    off, or not glibc (macOS, musl): False, with a warning for the latter."""
    if not on:
        return False
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":  # mallopt elsewhere (if any) takes other parameters
        log.warning("runtime.keep_freed_memory: this C library is not glibc: left off")
        return False
    mallopt = ctypes.CDLL(None).mallopt  # this process's C library
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(_M_MMAP_MAX, KEEP_FREED["MALLOC_MMAP_MAX_"]) and mallopt(
        _M_TRIM_THRESHOLD, KEEP_FREED["MALLOC_TRIM_THRESHOLD_"]
    )
    if not done:
        log.warning("runtime.keep_freed_memory: glibc's mallopt refused the setting: left off")
        return False
    os.environ.update({k: str(v) for k, v in KEEP_FREED.items()})
    log.info(
        "memory: freed blocks stay in the process for reuse (runtime.keep_freed_memory; up to 2 GiB of free heap)"
    )
    return True


def env_threads(environ=os.environ) -> int | None:
    """``OMP_NUM_THREADS`` when it is a positive whole number (OpenMP also allows a list for nested levels:
    its first entry), else None."""
    value = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


# What this process was started with: apply_threads writes OMP_NUM_THREADS for the processes a run starts,
# and a later run in the same process (the Python API, tests) must not take that for the user's setting.
STARTED_WITH_THREADS = env_threads()


def other_runs() -> list[int]:
    """Pids of other ``trivium run`` processes on this machine (Linux /proc; empty elsewhere). Trainer
    ranks of this run are not counted: they start later and share its threads by design."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    mine = {os.getpid(), os.getppid()}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if _is_trivium_run(words):
            found.append(int(entry.name))
    return sorted(found)


def _is_trivium_run(argv: list[str]) -> bool:
    """``trivium run ...`` or ``python -m trivium.cli run ...``."""
    for i, word in enumerate(argv):
        if (word.endswith("/trivium") or word == "trivium" or word == "trivium.cli") and "run" in argv[
            i + 1 : i + 2
        ]:
            return True
    return False
