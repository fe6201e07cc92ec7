"""bfloat16 on the hardware at hand: whether it is native, and bf16 numerics at fp32 speed where it is not.

Two things live here, shared by the trainer (``trainer.precision``) and the rollout engine
(``explorer.rollout.autocast_dtype``):

``native_bf16(device)``: whether the device multiplies bf16 in hardware (a CUDA device that supports it; a
CPU with AVX-512-BF16 or AMX), and what says so. ``TRIVIUM_FAST_BF16`` (``0``/``1``) overrides the CPU
probe: the test suite sets 0 so that ``auto`` means fp32 on every CI machine, and a user can set 1 where
the probe misses a capable CPU.

``bf16_autocast(device_type)``: ``torch.autocast`` in bf16, plus, on a CPU without bf16 instructions,
``Bf16MatmulEmulation`` for as long as the context is open. There torch's bf16 matrix products fall back
to a reference kernel that is 8-10x slower than fp32 (measured on a 2-core AMD EPYC with AVX2 only: a
2048x512x2048 product 236 ms in bf16 against 26 ms in fp32), which made a forced-bf16 quickstart take
hours. The emulation runs each bf16 matrix product as an fp32 product of the same bf16 operands, rounded
back to bf16. The product of two bf16 numbers (8-bit significands) is exact in fp32 (24 bits), and native
bf16 kernels (oneDNN on AVX-512-BF16/AMX, tensor cores) also accumulate in fp32 and round the output once,
so the result equals a native bf16 product up to the order of the fp32 summation: a forced ``bf16`` run
on such a CPU has the numerics of a bf16 machine at about fp32 speed, and every test of the bf16 path means
the same on every CI machine. Autocast itself is untouched (which ops run in bf16, what stays fp32); only
the kernel that multiplies changes. The backward pass runs inside the same context (``Optimization``
calls ``backward`` in ``Precision.backward_context``), since the gradients' products are bf16 too.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "Bf16MatmulEmulation",
    "bf16_autocast",
    "bf16_speedup",
    "cpu_flags",
    "emulates_bf16",
    "model_bf16_speedup",
    "native_bf16",
    "rollout_dtype",
]

_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_aten = torch.ops.aten
# the matrix products autocast runs in bf16, as the dispatcher sees them (linear, matmul and einsum
# decompose into these; attention's CPU kernel computes bf16 in fp32 blocks already and is fast)
_PRODUCTS = frozenset(
    {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.addbmm.default}
)
# products into a given tensor (``torch.mm(a, b, out=...)``, the chunked vocabulary head's backward): the
# product as above, copied into ``out``
_OUT_PRODUCTS = {_aten.mm.out: _aten.mm.default, _aten.addmm.out: _aten.addmm.default}


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


def native_bf16(
    device: torch.device,
    flags: set[str] | None = None,
    capability: str | None = None,
    cuda_capability: tuple[int, int] | None = None,
) -> tuple[bool, str]:
    """Whether ``device`` multiplies bfloat16 in hardware, and what says so.

    ``flags`` (the CPU's feature flags), ``capability`` (torch's CPU capability string, e.g. ``AVX2``,
    ``AVX512``, ``AVX512_BF16``) and ``cuda_capability`` (the GPU's compute capability) default to this
    machine's; tests pass them to decide for other machines.
    """
    device = torch.device(device)
    if device.type == "cuda":
        # compute capability 8.0 (Ampere) and later multiply bf16 on tensor cores; torch's
        # is_bf16_supported() also says yes for older GPUs, where it emulates bf16 (slower than fp32)
        major, minor = (
            torch.cuda.get_device_capability(device) if cuda_capability is None else cuda_capability
        )
        name = torch.cuda.get_device_name(device) if cuda_capability is None else "the CUDA device"
        if major >= 8:
            return True, f"{name} (compute capability {major}.{minor}) has bf16 tensor cores"
        return False, f"{name} (compute capability {major}.{minor} < 8.0) has no bf16 tensor cores"
    if device.type != "cpu":
        return False, f"no bf16 probe for device type {device.type}"
    forced = os.environ.get("TRIVIUM_FAST_BF16")
    if forced in ("0", "1"):
        return forced == "1", f"TRIVIUM_FAST_BF16={forced} overrides the CPU probe"
    flags = cpu_flags() if flags is None else flags
    found = sorted(f for f in _CPU_BF16_FLAGS if f in flags)
    if found:
        return True, f"the CPU has {', '.join(found)}"
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    if "BF16" in capability.upper() or "AMX" in capability.upper():
        return True, f"torch's CPU capability is {capability}"
    return False, (
        f"the CPU has neither {' nor '.join(_CPU_BF16_FLAGS)} (torch's CPU capability: {capability}): "
        "bf16 is emulated there"
    )


def rollout_dtype(
    setting: str | None,
    weights: str | torch.dtype,
    device: str | torch.device,
    engine_type: str = "transformers",
    trainer_precision: str = "auto",
    autocast_dtype: str | None = None,
) -> tuple[torch.dtype, str]:
    """The dtype of the rollout engine's weights for ``explorer.rollout.dtype: setting`` over a policy
    whose weights are ``weights`` on ``device``, and why. None (the default): the policy's. ``auto``:
    bfloat16 where the device multiplies bf16 natively (``native_bf16``), the policy is float32, the
    engine is the in-process transformers one and ``trainer.precision`` is auto or bf16 (a run that asks
    for fp32 training keeps fp32 rollouts); the policy's dtype elsewhere. Decoding reads every weight
    once per token, so bf16 weights halve its memory traffic (a 25M model samples 1.5x and a 100M one 2.0x
    faster on an AVX-512-BF16 CPU, benchmarks/decode_step.py); the trainer's log-probs stay float32, and the
    gap is logged every step (``mismatch/*``). The quickstart learns the same with bf16 rollouts from the
    transformers engine (docs/performance.md); vLLM's bf16 kernels sample differently and their learning is
    not measured, so ``auto`` keeps vLLM engines at the policy's dtype (ask for ``bfloat16`` to have it).
    ``auto`` with ``explorer.rollout.autocast_dtype`` keeps the policy's weights: autocast runs them in the
    lower precision itself."""
    from trivium.models.loading import resolve_device, resolve_dtype

    device = resolve_device(device)
    weights = resolve_dtype(weights, device)
    if setting is None:
        return weights, "the policy's dtype"
    if setting != "auto":
        return resolve_dtype(setting, device), "asked for"
    if weights != torch.float32:
        return weights, f"the policy's weights are {weights} already"
    if autocast_dtype is not None:
        return weights, f"the policy's dtype under explorer.rollout.autocast_dtype {autocast_dtype}"
    if trainer_precision not in ("auto", "bf16"):
        return weights, f"the policy's dtype under trainer.precision {trainer_precision}"
    if engine_type != "transformers":
        return (
            weights,
            f"the policy's dtype for {engine_type} engines (bf16 learning measured in-process only)",
        )
    fast, why = native_bf16(device)
    return (torch.bfloat16 if fast else torch.float32), why


def _cpu_has_bf16_instructions() -> bool:
    """The hardware probe alone (``TRIVIUM_FAST_BF16`` does not change which kernels torch can run)."""
    found = any(f in cpu_flags() for f in _CPU_BF16_FLAGS)
    capability = torch.backends.cpu.get_cpu_capability().upper()
    return found or "BF16" in capability or "AMX" in capability


_EMULATE: bool | None = None


def emulates_bf16(device_type: str) -> bool:
    """Whether ``bf16_autocast`` on ``device_type`` runs ``Bf16MatmulEmulation`` (a CPU without bf16
    instructions; ``TRIVIUM_BF16_EMULATION=0`` turns it off, to measure torch's own fallback kernels)."""
    global _EMULATE
    if device_type != "cpu" or os.environ.get("TRIVIUM_BF16_EMULATION") == "0":
        return False
    if _EMULATE is None:
        _EMULATE = not _cpu_has_bf16_instructions()
    return _EMULATE


class Bf16MatmulEmulation(TorchDispatchMode):
    """Runs bf16 matrix products as fp32 products of the same (bf16) operands, rounded to bf16: see the
    module docstring for why this equals a native bf16 product up to summation order. Every other op,
    and every product without a bf16 operand, runs as it is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _OUT_PRODUCTS and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args
        ):
            rest = {k: v for k, v in kwargs.items() if k != "out"}
            return kwargs["out"].copy_(self.__torch_dispatch__(_OUT_PRODUCTS[func], types, args, rest))
        if func in _PRODUCTS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            wide = [
                a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args
            ]
            return func(*wide, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def bf16_emulation(device_type: str):
    """``Bf16MatmulEmulation`` where ``emulates_bf16(device_type)``, else a no-op context."""
    return Bf16MatmulEmulation() if emulates_bf16(device_type) else contextlib.nullcontext()


@contextlib.contextmanager
def bf16_autocast(device_type: str, dtype: torch.dtype = torch.bfloat16):
    """``torch.autocast(device_type, dtype)``, with ``Bf16MatmulEmulation`` where the CPU has no bf16
    instructions (``dtype`` bf16 only)."""
    emulation = bf16_emulation(device_type) if dtype == torch.bfloat16 else contextlib.nullcontext()
    with emulation, torch.autocast(device_type=device_type, dtype=dtype):
        yield


def _timed(fn, sync) -> float:
    import time

    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def _speedup(one_pass, sync) -> float:
    """fp32 time / bf16 time of ``one_pass(low)``: the fastest of three interleaved passes, after a warm-up."""
    _timed(lambda: one_pass(False), sync), _timed(lambda: one_pass(True), sync)
    fp32, bf16 = [], []
    for _ in range(3):
        fp32.append(_timed(lambda: one_pass(False), sync))
        bf16.append(_timed(lambda: one_pass(True), sync))
    return min(fp32) / max(min(bf16), 1e-9)


def model_bf16_speedup(
    model: torch.nn.Module, device: torch.device, rows: int = 4, width: int = 256
) -> float:
    """How many times faster the model's own forward and backward pass over ``rows`` x ``width`` tokens
    runs under ``bf16_autocast`` than in fp32: the whole step's arithmetic *and* its per-op overheads,
    which decide at small sizes (a 1M-parameter model's products are too small to gain; a matrix
    microbenchmark would not see that). For models of up to ``FULL_MODEL_PROBE_PARAMS`` parameters,
    whose passes take milliseconds; larger ones are measured by ``bf16_speedup`` on their MLP shapes.

    The model is left as it was: its gradients (None afterwards, as before a step), its train/eval mode
    (the probe runs in eval mode: no dropout), and the global random state (the tokens come from a
    generator of their own, so a seeded run draws the same numbers with and without the probe)."""
    device = torch.device(device)
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 2)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (rows, width), generator=gen).to(device)
    was_training = model.training
    model.eval()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one_pass(low: bool) -> None:
        with bf16_autocast(device.type) if low else contextlib.nullcontext():
            out = model(input_ids=ids, use_cache=False).logits
        with bf16_emulation(device.type) if low else contextlib.nullcontext():
            out.float().mean().backward()

    try:
        return _speedup(one_pass, sync)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


FULL_MODEL_PROBE_PARAMS = 50_000_000


@functools.lru_cache(maxsize=16)
def bf16_speedup(device: str, hidden: int, intermediate: int, tokens: int = 256) -> float:
    """How many times faster one decoder MLP's forward and backward pass (``tokens`` x ``hidden`` ->
    ``intermediate`` -> ``hidden``, the bulk of a transformer's arithmetic) runs under ``bf16_autocast``
    than in fp32 on ``device``: the fastest of three timed passes of each, interleaved, after a warm-up.

    ``trainer.precision: auto`` asks this on hardware with native bf16, since whether bf16 pays depends on
    the shapes as much as on the hardware: a 128-wide model's products are too small to gain (measured on
    a CPU with AVX-512-BF16: the 1M-parameter quickstart 563 s in bf16 against 566 s in fp32), a 0.5B
    model's gain several times. Costs well under a second at the shapes of a 0.5B model on a CPU, once
    per process and shape."""
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen).to(dev).requires_grad_()
    up = (torch.randn(intermediate, hidden, generator=gen) / hidden**0.5).to(dev).requires_grad_()
    down = (torch.randn(hidden, intermediate, generator=gen) / intermediate**0.5).to(dev).requires_grad_()

    def one_pass(low: bool) -> None:
        with bf16_autocast(dev.type) if low else contextlib.nullcontext():
            y = torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, up)), down)
        with bf16_emulation(dev.type) if low else contextlib.nullcontext():
            y.float().square().mean().backward()

    return _speedup(one_pass, torch.cuda.synchronize if dev.type == "cuda" else (lambda: None))
