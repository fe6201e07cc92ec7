"""Measure a run's peak tensor memory on CPU: ``python tests/launch/peak_rss.py CONFIG [--set K=V ...]`` runs
``trivium run`` in this (fresh) process and prints one JSON line (MiB).

What "measured peak" means here (what ``trivium doctor`` estimates is tensors, not the interpreter): at the
start of the run's first step (the first explore or train step), the bytes of every live CPU tensor storage
(found through the garbage collector: the policy, the rollout engine's copy, frozen models) are counted and
read once (weights mapped from a safetensors file join RSS only when read), and the resident memory (RSS) is
read; at the end the kernel's high-water mark (VmHWM) is read. The peak is

    tensors at the first step + (VmHWM at the end - RSS at the first step)

that is, what was live when stepping began plus everything the steps added at their fullest: gradients,
optimizer state, activations, KV caches (and the little the steps' Python objects add). The high-water
mark is reset at the first step (``5`` written to ``/proc/self/clear_refs``, Linux 4.0+), so a peak of
the set-up (loading a model: its random initialisation and the loaded weights side by side) is not taken
for one of the steps; where the reset is refused, the mark since the start is read (``hwm_reset`` false)
and the figure may hold the set-up's peak. Left out on purpose:
the interpreter, the libraries and the run's set-up (its data read into Python objects, the tokenizer), ~100
MiB on the quickstart, which the doctor does not estimate. Run it with ``MALLOC_MMAP_THRESHOLD_=65536``
(``measure`` does): glibc then serves every block of 64 KiB or more (every tensor that matters) with its own
mmap and returns it to the system when freed, so RSS follows the live tensors instead of keeping freed heap
pages, and the high-water mark is the true peak of what was live.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(config: Path, *overrides: str, timeout: float = 900) -> dict:
    """Run ``config`` in a subprocess under this file; its JSON result (peak_mb and its parts)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "TRIVIUM_KILL_AT": ""}
    args = [a for o in overrides for a in ("--set", o)]
    out = subprocess.run(
        [sys.executable, __file__, str(config), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    import logging

    # everything the run imports, first (their code is no part of what the steps add)
    import math_verify  # noqa: F401
    import sympy  # noqa: F401
    import transformers.models.llama.modeling_llama
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    import trivium.launch.run as run_module
    import trivium.launch.stages  # noqa: F401
    from trivium.explorer.explorer import Explorer
    from trivium.trainer.trainer import Trainer
    from trivium.validation import load_config

    logging.basicConfig(level=logging.WARNING)
    config, overrides = argv[0], [v for k, v in zip(argv[1::2], argv[2::2]) if k == "--set"]
    run_cfg = load_config(config, overrides)
    start: dict[str, float] = {}
    for cls, name in ((Trainer, "train_step"), (Explorer, "explore_step")):
        setattr(cls, name, _first_step_mark(getattr(cls, name), start))
    run_module.run(run_cfg, overwrite=True)
    grown = rss_mb("VmHWM") - start["rss_mb"]
    out = {**start, "steps_added_mb": grown, "peak_mb": start["tensors_mb"] + grown}
    print(json.dumps(out))


def _first_step_mark(method, start: dict):
    """``method`` that, on the first step of either kind, records the live tensors and RSS in ``start``."""

    def step(self, *args, **kwargs):
        if not start:
            start.update(tensors_mb=live_tensor_bytes() / 2**20, hwm_before_mb=rss_mb("VmHWM"))
            start.update(rss_mb=rss_mb(), hwm_reset=reset_hwm())
        return method(self, *args, **kwargs)

    return step


def reset_hwm() -> bool:
    """Set this process's high-water mark (VmHWM) to its resident memory now; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return rss_mb("VmHWM") <= rss_mb() + 1


def live_tensor_bytes() -> int:
    """Bytes of every distinct CPU tensor storage the garbage collector can reach, each read once so that
    it is resident: weights loaded from a safetensors file are mapped pages that join RSS only when first
    read, and a step that first reads them would count them again as memory it added."""
    import gc

    import torch

    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage
    with torch.no_grad():
        for storage in storages.values():
            if storage.nbytes():
                torch.tensor([], dtype=torch.uint8).set_(storage).sum()
    return sum(s.nbytes() for s in storages.values())


if __name__ == "__main__":
    main(sys.argv[1:])
