"""Mixed precision in the trainer (``trainer.precision``): which one a run gets, and why.

``bf16``: forward and backward passes run under ``torch.autocast`` in bfloat16 (matmuls and most layers),
while the weights the optimizer updates stay float32 (the master copy) and so does AdamW's state. Every
number the algorithm reads is float32: logits are upcast before log-softmax (``logprobs.py``), and
losses, advantages and the rollout-vs-trainer mismatch are computed from those float32 log-probs.
``fp16``: the same in float16, with dynamic loss scaling (``torch.amp.GradScaler``); CUDA only, since
float16's narrow range needs the scaler and CPU autocast has no fast float16 path. ``fp32``: no autocast.
``auto``: bf16 where the hardware multiplies bf16 natively (a CUDA device of compute capability 8.0 or
later; a CPU with AVX-512-BF16 or AMX) *and* a measurement at start says bf16 runs the model's own
shapes at least ``AUTO_MIN_SPEEDUP`` times as fast as fp32; fp32 elsewhere. Small models gain nothing
from bf16 on a CPU (their products are too small) and would pay its rounding for nothing.

The hardware probe and the bf16 emulation for CPUs without bf16 instructions are in ``models/bf16.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trivium.models.bf16 import (
    FULL_MODEL_PROBE_PARAMS,
    bf16_autocast,
    bf16_emulation,
    bf16_speedup,
    model_bf16_speedup,
    native_bf16,
)
from trivium.trainer.logprobs import head_gradients_in_autocast
from trivium.trainer.probe_cache import remembered_speedup

__all__ = ["AUTO_MIN_SPEEDUP", "Precision", "Probe", "choose_precision", "model_probe", "resolve"]

log = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """What the trainer runs in: ``name`` (fp32, bf16 or fp16), on ``device_type``, and ``reason`` (for the
    run log and ``trivium check-config``)."""

    name: str
    device_type: str
    reason: str
    # trainer.head_grad_precision: "autocast" runs the chunked head's gradient products in ``dtype`` too
    head_grad_precision: str = "fp32"

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype; None for fp32."""
        return _DTYPES.get(self.name)

    def autocast(self):
        """Context of every forward pass of the trainer's models (no-op for fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        if self.head_grad_precision != "autocast":
            return bf16_autocast(self.device_type, self.dtype)
        stack = contextlib.ExitStack()
        stack.enter_context(bf16_autocast(self.device_type, self.dtype))
        stack.enter_context(head_gradients_in_autocast())
        return stack

    def backward_context(self):
        """Context of every backward pass: bf16's matrix-product emulation on CPUs without bf16
        instructions (``models/bf16.py``), nothing elsewhere."""
        return bf16_emulation(self.device_type) if self.name == "bf16" else contextlib.nullcontext()

    def prepare_attention(self, *models: torch.nn.Module | None) -> None:
        """bf16 on CPU: the models' sdpa attention becomes ``models/attention.py``'s (sdpa's CPU flash kernel
        is 2-2.5x slower at the short sequences of most RL samples; it is kept beyond ``SHORT_KEYS``)."""
        if self.name == "bf16" and self.device_type == "cpu":
            from trivium.models.attention import SHORT_KEYS, use_short_attention

            if use_short_attention(*models):
                log.info(
                    "attention: Trivium's short-sequence bf16 attention up to %d keys, sdpa beyond",
                    SHORT_KEYS,
                )

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """Dynamic loss scaling, for fp16 only (bf16 has float32's exponent range)."""
        return torch.amp.GradScaler(self.device_type) if self.name == "fp16" else None

    def describe(self, setting: str) -> str:
        line = f"trainer.precision {setting} -> {self.name}: {self.reason}"
        if self.dtype is not None and self.head_grad_precision == "autocast":
            line += f"; the vocabulary head's gradient products in {self.name} (trainer.head_grad_precision)"
        return line


# auto takes bf16 only where it is at least this much faster than fp32 on the model's own passes: below it
# the rounding (and, measured on an AVX-512-BF16 CPU, more resident memory) is paid for too little
AUTO_MIN_SPEEDUP = 1.2


@dataclass(frozen=True)
class Probe:
    """What ``auto`` measures before it takes bf16 (``what``, for the reason it gives) and the measurement:
    ``speedup()`` = fp32 time / bf16 time of that pass on the device."""

    what: str
    speedup: Callable[[], float]
    # the pass, for keeping its measurement per machine (``probe_cache``); None: measured every time
    cache_key: str | None = None


def model_probe(model: torch.nn.Module, device: torch.device) -> Probe | None:
    """The probe for a loaded model: its own forward and backward pass where that is cheap (up to
    ``FULL_MODEL_PROBE_PARAMS`` parameters: small models are decided by their per-op overheads, which only
    the real pass shows), its MLP's shapes above that; None for a model without a transformers config."""
    inner = getattr(model, "module", model)  # DDP
    params = sum(p.numel() for p in inner.parameters())
    if params <= FULL_MODEL_PROBE_PARAMS:
        return Probe(
            f"this model's forward and backward pass ({params / 1e6:.1f}M parameters, 4 x 256 tokens)",
            lambda: model_bf16_speedup(inner, device),
            f"model pass {_architecture_id(inner)}",
        )
    shape = _hidden_and_mlp(getattr(inner, "config", None))
    return None if shape is None else shape_probe(shape, device)


def shape_probe(shape: tuple[int, int], device: torch.device) -> Probe:
    hidden, intermediate = shape
    return Probe(
        f"this model's MLP (hidden {hidden}, intermediate {intermediate}, 256 tokens)",
        lambda: bf16_speedup(str(device), hidden, intermediate),
        f"MLP {hidden}x{intermediate}",
    )


def _architecture_id(model: torch.nn.Module) -> str:
    """A short id of the model's architecture (its config without paths and names), for ``Probe.cache_key``."""
    import hashlib
    import json

    config = getattr(model, "config", None)
    fields = config.to_dict() if hasattr(config, "to_dict") else {"class": type(model).__name__}
    fields = {k: v for k, v in fields.items() if not k.startswith("_") and k != "name_or_path"}
    text = json.dumps(fields, sort_keys=True, default=str)
    return f"{type(model).__name__} {hashlib.sha256(text.encode()).hexdigest()[:16]}"


def choose_precision(
    setting: str,
    device: torch.device,
    weights_dtype: torch.dtype = torch.float32,
    probe: Probe | None = None,
    head_grad_precision: str = "fp32",
) -> Precision:
    """The precision of ``trainer.precision: setting`` for weights of ``weights_dtype`` on ``device``.

    ``auto`` on hardware with native bf16 runs ``probe`` (see ``model_probe``) and takes bf16 where it is
    at least ``AUTO_MIN_SPEEDUP`` times as fast as fp32; without a probe it takes bf16. Raises ValueError
    (naming the field) for fp16 off CUDA and for autocast over low-precision weights, which would leave no
    float32 master copy. ``head_grad_precision``: ``trainer.head_grad_precision``, kept on the result."""
    chosen = _choose(setting, torch.device(device), weights_dtype, probe)
    return dataclasses.replace(chosen, head_grad_precision=head_grad_precision)


def _choose(setting: str, device: torch.device, weights_dtype: torch.dtype, probe: Probe | None) -> Precision:
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
    fast, why = native_bf16(device)
    if setting == "bf16":
        return Precision("bf16", device.type, "asked for" + ("" if fast else f" (note: {why})"))
    if not fast:
        return Precision("fp32", device.type, why)
    if probe is None:
        return Precision("bf16", device.type, why)
    try:
        if probe.cache_key is None:
            ratio, when = probe.speedup(), "measured at start"
        else:
            ratio, when = remembered_speedup(probe.cache_key, device, probe.speedup)
    except Exception as e:  # a model whose forward needs more than input_ids: the hardware decides
        return Precision("bf16", device.type, f"{why} (the speed probe of {probe.what} failed: {e!r})")
    measured = f"{why}, and bf16 ran {probe.what} {ratio:.2f}x as fast as fp32 ({when})"
    if ratio >= AUTO_MIN_SPEEDUP:
        return Precision("bf16", device.type, measured)
    return Precision(
        "fp32",
        device.type,
        f"{measured}: under the {AUTO_MIN_SPEEDUP}x that pays for bf16's rounding and memory "
        "(trainer.precision: bf16 forces it)",
    )


def _hidden_and_mlp(config) -> tuple[int, int] | None:
    hidden, intermediate = getattr(config, "hidden_size", None), getattr(config, "intermediate_size", None)
    return (int(hidden), int(intermediate)) if hidden and intermediate else None


def config_probe(model_cfg, device: torch.device) -> Probe | None:
    """The probe ``auto`` would run for a ``model`` config section, without its weights: a random
    initialisation of its architecture where ``model_probe`` would time the whole model (the ``tiny``
    recipe's, or a local ``path``'s ``config.json``), its MLP shapes above that; None where the
    architecture cannot be read here (a hub id offline, an unreadable folder)."""
    from pathlib import Path

    from transformers import AutoConfig

    from trivium.models.loading import auto_model_class

    try:
        if model_cfg.tiny is not None and not (Path(model_cfg.path) / "config.json").is_file():
            from trivium.models.tiny import recipe_config

            config = recipe_config(model_cfg.tiny)
        elif model_cfg.path and (Path(model_cfg.path) / "config.json").is_file():
            config = AutoConfig.from_pretrained(model_cfg.path)
        else:
            return None
        with torch.device("meta"):
            params = sum(p.numel() for p in auto_model_class(config).from_config(config).parameters())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if params <= FULL_MODEL_PROBE_PARAMS:
        return model_probe(auto_model_class(config).from_config(config).to(device), device)
    shape = _hidden_and_mlp(config)
    return None if shape is None else shape_probe(shape, device)


def resolve(setting: str, model_cfg) -> Precision:
    """What ``trainer.precision: setting`` becomes on this machine for a ``model`` config section, as the
    run will decide it (``config_probe`` for auto, only where bf16 is native). Raises ValueError as
    ``choose_precision`` does."""
    from trivium.models.loading import resolve_device, resolve_dtype

    device, dtype = resolve_device(model_cfg.device), resolve_dtype(model_cfg.dtype)
    probe = None
    if setting == "auto" and dtype == torch.float32 and native_bf16(device)[0]:
        probe = config_probe(model_cfg, device)
    return choose_precision(setting, device, dtype, probe)


def explain(setting: str, model_cfg) -> str:
    """One line for ``trivium check-config``: what ``trainer.precision: setting`` becomes on this machine
    for the ``model`` config section, and why; or why it cannot run."""
    try:
        return resolve(setting, model_cfg).describe(setting)
    except ValueError as e:
        return f"trainer.precision {setting}: cannot run here: {e}"
