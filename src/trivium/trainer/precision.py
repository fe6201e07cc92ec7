"""Mixed precision in the trainer (``trainer.precision``): which one a run gets, and why.

``bf16``: forward and backward passes run under ``torch.autocast`` in bfloat16 (matmuls and most layers),
while the weights the optimizer updates stay float32 (the master copy) and so does AdamW's state. Every
number the algorithm reads is float32: logits are upcast before log-softmax (``logprobs.py``), and
losses, advantages and the rollout-vs-trainer mismatch are computed from those float32 log-probs.
``fp16``: the same in float16, with dynamic loss scaling (``torch.amp.GradScaler``); CUDA only, since
float16's narrow range needs the scaler and CPU autocast has no fast float16 path. ``fp32``: no autocast.
``auto``: bf16 where the hardware multiplies bf16 fast (a CUDA device that supports it; a CPU with
AVX-512-BF16 or AMX), fp32 elsewhere (where bf16 is emulated and slower than fp32).

``TRIVIUM_FAST_BF16`` (``0``/``1``) overrides the CPU probe: the test suite sets 0 so that its exact-number
tests mean the same on every CI machine, and a user can set 1 where the probe misses a capable CPU.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Precision", "choose_precision", "fast_bf16"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Precision:
    """What the trainer runs in: ``name`` (fp32, bf16 or fp16), on ``device_type``, and ``reason`` (for the
    run log and ``trivium check-config``)."""

    name: str
    device_type: str
    reason: str

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype; None for fp32."""
        return _DTYPES.get(self.name)

    def autocast(self):
        """Context of every forward pass of the trainer's models (no-op for fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """Dynamic loss scaling, for fp16 only (bf16 has float32's exponent range)."""
        return torch.amp.GradScaler(self.device_type) if self.name == "fp16" else None

    def describe(self, setting: str) -> str:
        return f"trainer.precision {setting} -> {self.name}: {self.reason}"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags of the first processor in ``cpuinfo`` (empty where there is no such file)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


def fast_bf16(device: torch.device, flags: set[str] | None = None) -> tuple[bool, str]:
    """Whether ``device`` multiplies bfloat16 natively (faster than float32), and what says so."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return True, f"CUDA device {torch.cuda.get_device_name(device)} supports bf16"
        return False, f"CUDA device {torch.cuda.get_device_name(device)} has no bf16 support"
    if device.type != "cpu":
        return False, f"no bf16 probe for device type {device.type}"
    forced = os.environ.get("TRIVIUM_FAST_BF16")
    if forced in ("0", "1"):
        return forced == "1", f"TRIVIUM_FAST_BF16={forced} overrides the CPU probe"
    flags = cpu_flags() if flags is None else flags
    found = sorted(f for f in _CPU_BF16_FLAGS if f in flags)
    if found:
        return True, f"the CPU has {', '.join(found)}"
    capability = torch.backends.cpu.get_cpu_capability()
    if "BF16" in capability.upper() or "AMX" in capability.upper():
        return True, f"torch's CPU capability is {capability}"
    return False, (
        f"the CPU has neither {' nor '.join(_CPU_BF16_FLAGS)} (torch's CPU capability: {capability}): "
        "bf16 would be emulated, slower than fp32"
    )


def choose_precision(
    setting: str, device: torch.device, weights_dtype: torch.dtype = torch.float32
) -> Precision:
    """The precision of ``trainer.precision: setting`` for weights of ``weights_dtype`` on ``device``.

    Raises ValueError (naming the field) for fp16 off CUDA and for autocast over low-precision weights,
    which would leave no float32 master copy."""
    device = torch.device(device)
    if setting not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"trainer.precision={setting!r} is not one of auto, fp32, bf16, fp16")
    if setting == "fp32":
        return Precision("fp32", device.type, "asked for")
    if weights_dtype != torch.float32:
        if setting == "auto":
            return Precision(
                "fp32",
                device.type,
                f"model.dtype is {weights_dtype}: the weights themselves "
                "are low precision, so there is no float32 master copy to autocast from",
            )
        raise ValueError(
            f"trainer.precision={setting} keeps float32 master weights, but model.dtype loads them as "
            f"{weights_dtype}: set model.dtype: float32 (autocast gives the speed), or trainer.precision: fp32"
        )
    if setting == "fp16":
        if device.type != "cuda":
            raise ValueError(
                f"trainer.precision=fp16 needs a CUDA device (loss scaling, fast float16); the trainer runs on "
                f"{device}: use trainer.precision bf16 or auto on CPU"
            )
        return Precision("fp16", device.type, "asked for (with dynamic loss scaling)")
    fast, why = fast_bf16(device)
    if setting == "bf16":
        return Precision("bf16", device.type, "asked for" + ("" if fast else f" (note: {why})"))
    return Precision("bf16" if fast else "fp32", device.type, why)


def explain(setting: str, device: str, model_dtype: str) -> str:
    """One line for ``trivium check-config``: what ``trainer.precision: setting`` becomes on this machine
    for ``model.device`` and ``model.dtype`` (names as in the config), and why; or why it cannot run."""
    from trivium.models.loading import resolve_device, resolve_dtype

    try:
        return choose_precision(setting, resolve_device(device), resolve_dtype(model_dtype)).describe(setting)
    except ValueError as e:
        return f"trainer.precision {setting}: cannot run here: {e}"
