"""What a weights version is made of, and the one check that a rollout model loaded it right.

A state dict travels from the trainer (``Trainer.export_weights``) to rollout models through one of the
methods of ``trivium.sync``. Whatever the method, the receiving side ends with ``check_loaded``: it hashes
what the engine now holds and compares it with the checksum of what was sent, cast to the engine's dtype
(an engine may run in another precision, ``explorer.rollout.dtype``). A silently different policy would
poison every experience it samples, so a mismatch is an error, never a warning.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

__all__ = [
    "WeightSyncError",
    "cast_floating",
    "check_finite",
    "check_loaded",
    "floating_dtype",
    "untie",
    "weights_checksum",
]


class WeightSyncError(RuntimeError):
    """Weights did not arrive as sent: a checksum mismatch, a damaged file, or a wait that timed out."""


def floating_dtype(state: Mapping[str, torch.Tensor]) -> torch.dtype | None:
    """The dtype of the first floating-point tensor of ``state`` (a model's weights dtype), or None."""
    return next((t.dtype for t in state.values() if t.is_floating_point()), None)


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t


def cast_floating(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``state`` with its floating-point tensors in ``dtype`` (None, or already that dtype: unchanged)."""
    return {k: _cast(t, dtype) for k, t in state.items()}


def weights_checksum(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> str:
    """sha256 over names, dtypes, shapes and bytes of every tensor, in name order (device independent).

    ``dtype``: hash the floating-point tensors as cast to it, which is what a rollout engine in another
    precision holds after loading them. One tensor at a time: no second copy of the weights."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = _cast(state[name].detach(), dtype).to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def check_loaded(engine, expected: str, version: int, source: str) -> None:
    """Raise ``WeightSyncError`` unless ``engine`` holds the weights whose checksum is ``expected``.

    ``expected`` must already be the checksum in the engine's dtype (see ``weights_checksum(state, dtype)``);
    ``source`` says where the weights came from, for the message."""
    got = engine.weights_checksum()
    if got != expected:
        raise WeightSyncError(
            f"weights version {version} from {source}: the rollout model's checksum {got[:12]} differs from "
            f"the sent weights' {expected[:12]} after loading. The two models differ in structure or dtype "
            "(a different model.path on the two sides?), or the weights were damaged on the way"
        )


def check_finite(state: Mapping[str, torch.Tensor], version: int, where: str) -> None:
    """Raise ``WeightSyncError`` when a floating-point weight holds NaN or inf: such a version is never
    published or loaded (every sample of it would be garbage; the trainer's guard should have stopped it)."""
    for name, t in state.items():
        # a sum is finite unless an element is not (or the sum overflows: then every element is looked at);
        # one pass over the weights instead of isfinite's two (0.9 -> ~0.2 s at 0.5B parameters)
        if t.is_floating_point() and not torch.isfinite(t.sum()) and not bool(torch.isfinite(t).all()):
            raise WeightSyncError(
                f"weights version {version} ({where}): {name} holds NaN or inf; the version is refused. The "
                "trainer skips non-finite updates (trainer.skip_grad_norm): was it written by something else?"
            )


def same_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``a`` and ``b`` hold the very same tensors under the same names (views of the same memory with
    the same layout): loading one into the other would change nothing, and there is nothing to verify."""
    return a.keys() == b.keys() and all(
        x.data_ptr() == y.data_ptr()
        and x.dtype == y.dtype
        and x.device == y.device
        and x.shape == y.shape
        and x.stride() == y.stride()
        for x, y in ((a[k], b[k]) for k in a)
    )


def untie(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share storage (tied embeddings): give each its own copy."""
    seen: set[int] = set()
    out = {}
    for k, v in tensors.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out
