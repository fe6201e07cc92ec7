"""Turn config strings into devices, dtypes, tokenizers and models.

Design decisions:
- Device and dtype are always explicit parameters downstream; this is the one place that resolves "auto".
  ``"auto"`` dtype is float32 on CPU and bfloat16 on CUDA devices that support it. Rollout log-probs are only
  fp32-exact with float32 weights, so configs that feed log-probs to a trainer should say ``"float32"``.
- A missing local folder fails before transformers turns it into a hub lookup, with the path in the
  message and the command that builds a tiny local model.
- Every tokenizer leaves here with a pad token, because batching needs one.

Left out on purpose: quantisation, device maps and sharded loading; large models go to a real engine.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["auto_model_class", "load_causal_lm", "load_tokenizer", "resolve_device", "resolve_dtype"]

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"[\w-][\w.-]*(/[\w.-]+)?")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str | torch.device) -> torch.device:
    """``"auto"`` → ``cuda`` when available, else ``cpu``; anything else is parsed and checked."""
    if isinstance(name, torch.device):
        device = name
    elif name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except RuntimeError as e:
            raise ValueError(
                f"device={name!r} is not a torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'"
            ) from e
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(
                f"device={str(name)!r} but MPS (Apple's GPU) is not available; use 'cpu' or 'auto'"
            )
    elif device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device={str(name)!r}: trivium runs on 'cpu', 'cuda', 'cuda:N' or 'mps' ('auto' picks)"
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={str(name)!r} but CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); use device 'cpu' or 'auto'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={str(name)!r} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
                f"use 'cuda:0'..'cuda:{torch.cuda.device_count() - 1}'"
            )
    return device


def resolve_dtype(name: str | torch.dtype, device: torch.device | None = None) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"``, or ``"auto"`` (bfloat16 on capable CUDA, else float32)."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        cuda = device is not None and device.type == "cuda"
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not one of {[*DTYPES, 'auto']}")
    return DTYPES[name]


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer`` for a local folder or hub id, with a pad token (eos when the tokenizer has none)."""
    from transformers import AutoTokenizer

    source = _check_source(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as e:
        raise _not_found(path, e) from e
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(
                f"Tokenizer at {path} has neither a pad nor an eos token; set one in its tokenizer_config.json"
            )
        log.warning("Tokenizer at %s has no pad token; using eos %r for padding", path, tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """``AutoModelForCausalLM`` in eval mode on ``device`` with weights in ``dtype``; a vision-language
    model (a config with a ``vision_config``) is loaded whole by ``AutoModelForImageTextToText``.

    ``attn_implementation`` None keeps the transformers default (sdpa where supported).
    """
    from transformers import AutoConfig

    source = _check_source(path)
    dev = resolve_device(device)
    try:
        model = auto_model_class(AutoConfig.from_pretrained(source)).from_pretrained(
            source, dtype=resolve_dtype(dtype, dev), attn_implementation=attn_implementation
        )
    except OSError as e:
        raise _not_found(path, e) from e
    return model.to(dev).eval()


def auto_model_class(config):
    """The transformers auto class that builds ``config``'s whole model: ``AutoModelForImageTextToText`` for a
    vision-language model (a ``vision_config``), else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from trivium.models.vision import is_vision_config

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def _check_source(path: str | Path) -> str:
    """The path as a string; fail early when it is meant as a local folder but does not exist.

    A hub id looks like ``name`` or ``org/name``; a ``Path``, or text with a leading ``.``, ``/`` or ``~`` or
    more than one slash, is meant as a local folder.
    """
    text = str(path)
    if Path(text).expanduser().exists():
        return str(Path(text).expanduser())
    if isinstance(path, Path) or not _HUB_ID.fullmatch(text):
        raise FileNotFoundError(
            f"Model folder {text!r} does not exist. Pass a folder written by save_pretrained (or a hub id "
            f"such as 'Qwen/Qwen2.5-0.5B' when online); for a tiny local test model run "
            f"`trivium make-tiny {text}`."
        )
    return text


def _not_found(path: str | Path, cause: Exception) -> FileNotFoundError:
    return FileNotFoundError(
        f"Could not load {str(path)!r}: it is not a local folder and the hub lookup failed ({cause}). Check "
        f"the id and network (HF_HUB_OFFLINE), or run `trivium make-tiny PATH` for a tiny local test model."
    )
