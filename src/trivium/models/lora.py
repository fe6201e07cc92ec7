"""LoRA through ``peft``: attach adapters for a stage, merge them into plain weights for rollout engines.

Design decisions:
- Only the adapter weights train (their parameters alone reach the optimizer); the base stays frozen, so
  the reference model of a KL term is the base itself with the adapters disabled
  (``peft_model.disable_adapter()``): no second copy of the weights.
- Rollout engines get *merged* weights, ``W + (alpha/r)·B·A``, under the base model's own names
  (``merged_state_dict``). One sync path serves every engine (the in-process engine and vLLM alike), a
  merged model samples as fast as the base, and the engine needs no LoRA kernels; the price is that a sync
  sends every weight rather than the adapter only. The merge is computed from the state dict, never in
  place in the model, so repeated syncs accumulate no rounding.
- Checkpoints hold the adapter in PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``),
  which ``PeftModel.from_pretrained(base, folder)`` loads; ``trivium convert`` merges it into a plain folder.

Left out: DoRA, rsLoRA scaling variants, LoRA on embeddings, several adapters at once.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "ADAPTER_CONFIG",
    "attach",
    "base_model",
    "is_adapter_folder",
    "is_peft",
    "lora_layers",
    "merged_copy",
    "merged_state_dict",
    "prepare",
    "trainable_parameters",
]

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER = "default"
_PREFIX = "base_model.model."


def is_peft(model: Any) -> bool:
    """A PEFT model (FSDP2 subclasses it in place, so this is an isinstance check, not a class name)."""
    peft = sys.modules.get("peft")  # not imported: no PEFT model can exist
    return peft is not None and isinstance(model, peft.PeftModel)


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a PEFT model (its modules carry the LoRA layers); the model otherwise."""
    return model.get_base_model() if is_peft(model) else model


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def peft_config(cfg) -> Any:
    """A ``peft.LoraConfig`` from ``model.lora`` (``trivium.config.schema.LoraConfig``)."""
    from peft import LoraConfig

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    return LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def attach(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """``model`` with fresh LoRA adapters (``model.lora``); every other parameter frozen."""
    from peft import get_peft_model

    try:
        peft_model = get_peft_model(model, peft_config(cfg))
        trainable, total = trainable_parameters(peft_model)
        log.info(
            "LoRA rank %d on %s: %d of %d parameters train (%.2f%%)",
            cfg.rank,
            cfg.target_modules,
            trainable,
            total,
            100 * trainable / max(1, total),
        )
        return peft_model
    except ValueError as error:  # peft: "Target modules {...} not found in the base model"
        names = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if _is_linear(m)})
        raise ValueError(
            f"model.lora.target_modules={cfg.target_modules!r} matches no layer of {type(model).__name__} "
            f"({error}); its linear layers are named {names}, or use 'all-linear'"
        ) from error


def prepare(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """The model a stage trains: adapters attached when ``cfg`` (``model.lora``) asks for them, kept when
    the previous stage trained the same adapters, merged away when the stage trains every weight."""
    if is_peft(model):
        same = cfg is not None and _same_adapter(model, cfg)
        if same:
            return model
        model = merged_copy(model)
    return model if cfg is None else attach(model, cfg)


def _same_adapter(model, cfg) -> bool:
    """Whether the PEFT model's adapters are the ones ``cfg`` asks for (peft stores 'all-linear' expanded
    into module paths, so both sides are compared as sets of layer names)."""
    own = model.peft_config[ADAPTER]
    targets = own.target_modules
    own_names = {targets} if isinstance(targets, str) else {t.rsplit(".", 1)[-1] for t in targets}
    wanted = set(cfg.target_modules) if cfg.target_modules != "all-linear" else _linear_names(model)
    return (own.r, own.lora_alpha, own_names) == (cfg.rank, cfg.alpha, wanted)


def _linear_names(model: torch.nn.Module) -> set[str]:
    """Last name parts of the linear layers LoRA's 'all-linear' targets: every one but the output head."""
    base = base_model(model)
    head = base.get_output_embeddings()
    names = set()
    for name, module in base.named_modules():
        if not _is_linear(module) or module is head or ".lora_" in name:
            continue
        names.add(name.removesuffix(".base_layer").rsplit(".", 1)[-1])
    return names


def lora_layers(model: torch.nn.Module) -> dict[str, tuple[float, bool]]:
    """``{module name in the base model: (scaling, fan_in_fan_out)}`` of every LoRA layer."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, module in base_model(model).named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            out[name] = (float(module.scaling[ADAPTER]), bool(getattr(module, "fan_in_fan_out", False)))
    return out


def merged_state_dict(
    state: Mapping[str, torch.Tensor], layers: Mapping[str, tuple[float, bool]]
) -> dict[str, torch.Tensor]:
    """The plain model's state dict from a PEFT model's (``state``, its own names): adapter weights folded
    into their base weights, ``W + scaling·B·A`` (in float32, cast back), names without the PEFT parts."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
        out[name.replace(".base_layer.", ".")] = value
    for module, (scaling, fan_in_fan_out) in layers.items():
        a = state[f"{_PREFIX}{module}.lora_A.{ADAPTER}.weight"].float()
        b = state[f"{_PREFIX}{module}.lora_B.{ADAPTER}.weight"].float()
        delta = (b @ a) * scaling
        weight = out[f"{module}.weight"]
        out[f"{module}.weight"] = (weight.float() + (delta.T if fan_in_fan_out else delta)).to(weight.dtype)
    return out


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain Hugging Face model with the adapters merged in (the model itself when it has none)."""
    if not is_peft(model):
        return model
    return copy.deepcopy(model).merge_and_unload()


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def load_adapter(path: str | Path, fallback_base: str, loader) -> torch.nn.Module:
    """A PEFT model from an adapter folder; its base from the path recorded in the adapter's config, or
    ``fallback_base`` (``model.path``) when that is gone. ``loader(path)`` loads a plain model."""
    from peft import PeftModel

    recorded = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
    base_path = recorded if recorded and Path(recorded).exists() else fallback_base
    if not base_path:
        raise FileNotFoundError(
            f"{path} holds a LoRA adapter whose base model ({recorded!r}) is not here; set model.path to it"
        )
    return PeftModel.from_pretrained(loader(base_path), str(path), is_trainable=True)


def _is_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear)
