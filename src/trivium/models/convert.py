"""``trivium convert``: a checkpoint (full, LoRA adapter, or torch.distributed.checkpoint shards) into a plain
Hugging Face model folder that ``AutoModelForCausalLM.from_pretrained`` and vLLM load, optionally cast.

Sources, by what the folder holds:
- a run's checkpoint ``step_N/`` : its ``model/`` (or, with ``from_shards``, its ``dcp/`` shards);
- a Hugging Face model folder: loaded and written again (to cast it);
- a LoRA adapter folder (``adapter_config.json``): its base model (the path recorded in the adapter, or
  ``base``) with the adapter merged in; ``merge=False`` writes the adapter itself, cast;
- shards (``dcp/``, ``.metadata`` inside): the model state assembled from every rank's file, without a
  process group; the architecture comes from the checkpoint's ``model/config.json`` (or ``base``).
The tokenizer is copied when the source has one.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

from trivium.models import lora

log = logging.getLogger(__name__)

__all__ = ["convert"]


def convert(
    source: str | Path,
    out: str | Path,
    *,
    dtype: str | None = None,
    merge: bool = True,
    base: str | None = None,
    from_shards: bool = False,
) -> Path:
    """Write ``source`` as a plain model folder at ``out`` (see the module docstring); returns ``out``."""
    from trivium.models.loading import load_causal_lm, load_tokenizer, resolve_dtype

    source, out = Path(source), Path(out)
    if not source.exists():
        raise FileNotFoundError(f"trivium convert: {source} does not exist")
    if (source / "model").is_dir() and not from_shards:
        source = source / "model"
    if from_shards and (source / "dcp").is_dir():
        source = source / "dcp"
    cast = None if dtype is None else resolve_dtype(dtype)
    if (source / ".metadata").is_file():
        model = _from_shards(source, base)
        tokenizer_from = source.parent / "model"
    elif lora.is_adapter_folder(source):
        model = lora.load_adapter(source, base or "", lambda path: load_causal_lm(path, dtype="float32"))
        if merge:
            model = model.merge_and_unload()
        tokenizer_from = source
    elif (source / "config.json").is_file():
        model = load_causal_lm(source, dtype="float32")
        tokenizer_from = source
    else:
        raise ValueError(
            f"trivium convert: {source} holds no model: give a checkpoint folder (step_N), a model folder "
            "(config.json), a LoRA adapter folder (adapter_config.json) or shards (dcp/ with .metadata)"
        )
    if cast is not None:
        model = model.to(cast)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    try:
        load_tokenizer(tokenizer_from).save_pretrained(out)
    except (OSError, ValueError):
        log.warning("no tokenizer next to %s: %s has the weights only", source, out)
    return out


def _from_shards(folder: Path, base: str | None) -> torch.nn.Module:
    """The model saved in torch.distributed.checkpoint shards (every rank's file), assembled in one process."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig

    from trivium.models.loading import auto_model_class

    arch = base or folder.parent / "model"
    if lora.is_adapter_folder(arch):
        raise ValueError(
            f"{folder} holds the shards of a LoRA run: convert its model/ folder (the adapter) instead"
        )
    try:
        config = AutoConfig.from_pretrained(arch)
    except OSError as error:
        raise FileNotFoundError(
            f"trivium convert: the architecture of {folder} comes from {arch}/config.json, which is missing; "
            "pass --base with a folder that has the model's config.json"
        ) from error
    model = auto_model_class(config).from_config(config, dtype=torch.float32)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process is the intent
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    model.load_state_dict(state["model"])
    return model.eval()
