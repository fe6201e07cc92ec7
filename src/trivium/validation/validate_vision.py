"""Checks of a run with a vision-language policy (docs/vision.md): what takes images and what does not yet.

Whether the policy is a vision-language model is known without loading it: ``model.tiny.architecture:
qwen2_vl``, or a local model folder whose ``config.json`` has a ``vision_config``; a hub id is not looked up
(None: unknown, nothing is refused).
"""

from __future__ import annotations

import json
from pathlib import Path

from trivium.config.errors import Problem
from trivium.config.schema import TriviumConfig

IMAGE_WORKFLOWS = ("visual_qa",)  # built-in workflows whose tasks bring images


def is_vision_policy(cfg: TriviumConfig) -> bool | None:
    if cfg.model.tiny is not None and not (cfg.model.path and Path(cfg.model.path).exists()):
        return cfg.model.tiny.architecture == "qwen2_vl"
    config = Path(cfg.model.path).expanduser() / "config.json" if cfg.model.path else None
    if config is None or not config.is_file():
        return None
    try:
        return "vision_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return None  # an unreadable config is the model checks' to report


def check_vision(cfg: TriviumConfig, at) -> list[Problem]:
    vision = is_vision_policy(cfg)
    problems: list[Problem] = []
    if vision is False:
        if cfg.model.freeze_vision:
            problems.append(
                Problem(
                    at("model.freeze_vision"),
                    True,
                    "the model is a text model: it has no vision tower to freeze",
                    "set model.freeze_vision: false, or use a vision-language model",
                )
            )
        from trivium.validation.validate_data import extra_tasksets

        sections = [("buffer.taskset", cfg.buffer.taskset), *extra_tasksets(cfg)]
        sections += [(f"buffer.eval_tasksets[{i}]", ts) for i, ts in enumerate(cfg.buffer.eval_tasksets)]
        if cfg.mode in ("both", "explore", "bench", "serve"):
            for field, ts in sections:
                if ts is not None and ts.workflow in IMAGE_WORKFLOWS:
                    problems.append(
                        Problem(
                            at(f"{field}.workflow"),
                            ts.workflow,
                            "this workflow's tasks bring images and the model is a text model",
                            "use a vision-language model (model.tiny.architecture: qwen2_vl, or a Qwen2-VL folder)",
                        )
                    )
    if not vision:
        return problems
    if cfg.explorer.rollout.engine_type == "vllm":
        problems.append(
            Problem(
                at("explorer.rollout.engine_type"),
                "vllm",
                "vision-language policies run on the transformers engine; the vLLM engine's image inputs are "
                "not wired yet (docs/vision.md)",
                "use explorer.rollout.engine_type: transformers",
            )
        )
    if cfg.trainer.pack_length is not None:
        problems.append(
            Problem(
                at("trainer.pack_length"),
                cfg.trainer.pack_length,
                "packed rows are not supported with images (M-RoPE positions are computed per sequence from "
                "its attention mask)",
                "set trainer.pack_length: null",
            )
        )
    from trivium.algorithm.presets import get_preset

    if get_preset(cfg.algorithm.algorithm_type).needs_critic:
        problems.append(
            Problem(
                at("algorithm.algorithm_type"),
                cfg.algorithm.algorithm_type,
                "critic-based algorithms (a value model) do not take images yet",
                "use a critic-free algorithm (grpo, rloo, opmd, ...) with a vision-language model",
            )
        )
    return problems
