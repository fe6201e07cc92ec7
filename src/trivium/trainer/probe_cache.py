"""The bf16 speed probe's measurements, kept per machine so that ``trainer.precision: auto`` decides the same
way on every run there.

The probe times a model's pass in fp32 and in bf16 and takes bf16 at ``AUTO_MIN_SPEEDUP`` or more. Near
that threshold the timing alone decided: on a 2-core AVX-512-BF16 machine the tiny quickstart model
measured 1.14x to 1.33x from one run to the next, so the same command trained in bf16 one time and in fp32
the next (and a resumed run could change precision halfway). The first measurement of a pass on a machine
is now kept in a small JSON file, keyed by the pass (the model's architecture or shapes), the device, the
threads and torch's version; later runs there read it back and say so. Deleting the file measures again.

Runs started together (a benchmark's variants side by side) would each find no entry and measure at once,
slowing each other down: on the 2-core machine three such runs of one model decided fp32, bf16 and bf16.
So the read, the measurement and the write happen under an exclusive lock on a file beside the cache
(``fcntl.flock``, POSIX): the first run measures alone, the others wait for it and read what it kept.

A measurement taken while the machine is busy (the 1-minute load average above ``TRIVIUM_PROBE_MAX_LOAD``,
by default the CPU count: other processes compete for the cores the probe times) is used for this run and
not kept: under load the same model's pass measured bf16 at 0.59x fp32 (1.95x when idle), and keeping that
would fix every later run there on fp32.

Where: ``TRIVIUM_PROBE_CACHE`` (a file path; ``0`` turns keeping off, as the test suite does), else
``$XDG_CACHE_HOME/trivium/precision_probe.json``, else ``~/.cache/trivium/precision_probe.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from trivium.files import write_atomically

__all__ = ["cache_file", "machine", "remembered_speedup"]


def cache_file() -> Path | None:
    """The file measurements are kept in, or None when keeping is off (``TRIVIUM_PROBE_CACHE=0``)."""
    setting = os.environ.get("TRIVIUM_PROBE_CACHE", "")
    if setting == "0":
        return None
    if setting:
        return Path(setting)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "trivium" / "precision_probe.json"


def machine(device: torch.device) -> str:
    """The device a measurement holds for: the GPU's name, or the CPU's model name and torch's threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} threads"


def remembered_speedup(key: str, device: torch.device, measure: Callable[[], float]) -> tuple[float, str]:
    """``measure()``'s speed-up for the pass ``key`` on ``device``, read from the cache file when it holds
    one, measured (and kept) otherwise; and the words that say which."""
    path = cache_file()
    if path is None:
        return measure(), "measured at start"
    full_key = f"{key} | {device.type}: {machine(device)} | torch {torch.__version__}"
    with _locked(path):
        try:
            kept = json.loads(path.read_text())
            kept = kept if isinstance(kept, dict) else {}
        except (OSError, ValueError):
            kept = {}
        entry = kept.get(full_key)
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("speedup"), (int, float))
            and entry["speedup"] > 0
        ):
            return float(entry["speedup"]), (
                f"measured on this machine on {entry.get('date', '?')}, kept in {path}; delete it to measure again"
            )
        ratio = measure()
        busy = _busy()
        if busy:
            return ratio, f"measured at start, not kept: {busy}; a later run measures again"
        kept[full_key] = {"speedup": ratio, "date": time.strftime("%Y-%m-%d")}
        try:
            write_atomically(path, json.dumps(kept, indent=1, sort_keys=True))  # another run may read it now
            return ratio, f"measured at start, kept in {path} so that later runs here decide the same"
        except OSError as error:  # a read-only home: decide by this measurement alone
            return ratio, f"measured at start (not kept: {error.strerror or error})"


def _busy() -> str:
    """Why a measurement should not be kept ('' when the machine looks idle enough): the load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): keep it
        return ""
    cpus = os.cpu_count() or 1
    limit = float(os.environ.get("TRIVIUM_PROBE_MAX_LOAD") or cpus)
    return (
        f"the machine was busy (load average {load:.1f} on {cpus} CPUs, above {limit:g})"
        if load > limit
        else ""
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (module docstring); without fcntl or a writable folder, none."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 - closed below
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes, or the process dies
        yield
    finally:
        handle.close()
