"""What the explorer asks of a rollout model: token ids in, sampled token ids and their log-probs out.

Design decisions:
- Prompts and responses are token ids, never text, so the trainer trains on exactly what was sampled.
- Log-prob contract: ``Generation.logprobs[j]`` is ``log_softmax(logits / T)`` of the sampled token, in fp32,
  over the *unfiltered* temperature-scaled distribution. top-k / top-p change which tokens can be drawn,
  not the reported value, so it equals what a trainer recomputes with one teacher-forced fp32 forward pass
  over prompt + response (scaled by the same T). Greedy (T = 0) reports the T = 1 log-probs.
- ``SamplingParams`` is frozen and hashable, so a batching layer can group requests by it.

Left out on purpose: per-request seeds, logit processors and beam search; an engine owns its RNG.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "FinishReason",
    "Generation",
    "RolloutModel",
    "SamplingParams",
    "TaskCancelled",
    "check_prompts",
    "checked_state_dict",
    "eos_token_ids",
]

FinishReason = Literal["eos", "stop", "length"]


class TaskCancelled(Exception):
    """The explorer went ahead without this task (``explorer.over_rollout``): raised in its workflow at the
    next model or environment call; the task is dropped, not failed."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` samples per prompt; ``temperature`` 0 means greedy (argmax)."""

    n: int = 1
    temperature: float = 1.0  # 0 => greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1 => off
    top_k: int = 0  # tokens kept; 0 => off
    max_tokens: int = 64  # response tokens at most (also capped by the model's context length)
    stop: tuple[str, ...] = ()  # stop when the decoded response contains one of these strings
    stop_token_ids: tuple[int, ...] = ()  # stop on these tokens (in addition to eos); they stay in the output
    include_stop_str_in_output: bool = True  # False: `text` ends before the stop string (token ids never cut)

    def __post_init__(self) -> None:
        # Tuples keep the object hashable even when a caller passes lists.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        problems = []
        if self.n < 1:
            problems.append(f"n={self.n} must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} must be in (0, 1]; use 1.0 to turn it off")
        if self.top_k < 0:
            problems.append(f"top_k={self.top_k} must be >= 0; use 0 to turn it off")
        if self.max_tokens < 1:
            problems.append(f"max_tokens={self.max_tokens} must be >= 1")
        if any(not isinstance(s, str) or not s for s in self.stop):
            problems.append(f"stop={self.stop!r} must hold non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            problems.append(f"stop_token_ids={self.stop_token_ids!r} must hold token ids >= 0")
        if problems:
            raise ValueError("Invalid SamplingParams: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One sampled response. ``len(logprobs) == len(response_ids)``; ``text`` skips special tokens.

    ``response_ids`` end with the token that finished the response (eos, a stop token id, or the token that
    completed a stop string) unless ``finish_reason == "length"``.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    text: str
    # the weights version that sampled each response token, where the engine knows it (empty: not told);
    # a generation that spans an in-flight weight update (explorer.rollout.in_flight_updates) has two or more
    versions: tuple[int, ...] = field(default=(), compare=False)  # what was sampled compares, not by whom

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.response_ids):
            raise ValueError(
                f"Generation.logprobs has {len(self.logprobs)} entries but response_ids has "
                f"{len(self.response_ids)}; they must be aligned one per response token"
            )
        if self.versions and len(self.versions) != len(self.response_ids):
            raise ValueError(
                f"Generation.versions has {len(self.versions)} entries but response_ids has "
                f"{len(self.response_ids)}; give one per response token, or none"
            )


@runtime_checkable
class RolloutModel(Protocol):
    """A policy the explorer samples from, whose weights the trainer replaces between steps."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def version(self) -> int:
        """Weights version of the last ``update_weights`` (0 for the initial weights)."""
        ...

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` generations for each prompt, in prompt order: ``out[i][j]`` is sample j of prompt i.

        An engine that takes images (a vision-language model: ``TransformersEngine``) also accepts
        ``media=[PromptImages | None, ...]``, one per prompt; callers pass it only when a prompt has images,
        so engines without images keep this signature."""
        ...

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Copy ``state_dict`` into the weights (any device/dtype) and set ``version``: between generate calls,
        or (an engine with in-flight updates) at the next token boundary of a running one; the new version is
        held when this returns."""
        ...

    def state_dict(self) -> dict[str, Tensor]: ...

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype the engine holds its floating-point weights in (``explorer.rollout.dtype``)."""
        ...

    def weights_checksum(self) -> str:
        """``models.weights.weights_checksum`` of what the engine holds, computed where the weights are (an
        engine in another process answers without sending them)."""
        ...

    def metrics(self) -> dict[str, float]:
        """The engine's own counters for the step's record (e.g. ``rollout/engine_restarts``); may be empty."""
        ...


def check_prompts(prompts: Sequence[Sequence[int]], max_length: int, vocab_size: int) -> None:
    """What every engine refuses before sampling: empty prompts, prompts that fill the context, and token ids
    outside the vocabulary (a prompt tokenised with another tokenizer)."""
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"generate(): prompt {i} is empty; every prompt needs at least one token")
        if len(p) >= max_length:
            raise ValueError(
                f"generate(): prompt {i} has {len(p)} tokens but the model's context is {max_length} "
                "(max_position_embeddings); shorten the prompt or use a model with a longer context"
            )
        low, high = min(p), max(p)
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"generate(): prompt {i} has token ids in [{low}, {high}] but the model's vocabulary is "
                f"[0, {vocab_size}); was it tokenised with another tokenizer?"
            )


def checked_state_dict(
    state_dict: Mapping[str, Tensor],
    own: Mapping[str, Tensor],
    tied: Mapping[str, str],
    version: int,
    what: str,
) -> dict[str, Tensor]:
    """``state_dict`` completed with tied weights (``tied``: target -> source, which checkpoints leave out)
    and checked against the engine's own tensors ``own``: the same keys and shapes, or a ValueError that
    lists what differs (raised before anything is copied, so a rejected update leaves the engine as it was).
    ``what`` names the engine's model in the error."""
    full = dict(state_dict)
    for target, source in tied.items():
        if target not in full and source in full:
            full[target] = full[source]
    missing, unexpected = sorted(own.keys() - full.keys()), sorted(full.keys() - own.keys())
    wrong_shape = [
        f"{k}: {tuple(full[k].shape)} vs {tuple(own[k].shape)}"
        for k in own.keys() & full.keys()
        if full[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong_shape:
        raise ValueError(
            f"update_weights(version={version}): state dict does not match {what}: "
            f"{len(missing)} missing keys {missing[:5]}, {len(unexpected)} unexpected keys {unexpected[:5]}, "
            f"{len(wrong_shape)} shape mismatches (given vs expected) {sorted(wrong_shape)[:5]}. Pass the "
            "full state_dict() of a model with the same config (strip wrapper prefixes such as 'module.' or "
            "'_orig_mod.' first)."
        )
    return full


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, generation_config, what: str) -> set[int]:
    """The ids that end a response, the same for every engine: the tokenizer's eos plus every eos id of the
    model's generation config (some models have several; ``generation_config`` may be None). ``what``
    names the engine in the error."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, Iterable):
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError(
            f"{what}: neither the tokenizer nor the model's generation config defines an eos token id; set "
            "tokenizer.eos_token or eos_token_id in generation_config.json"
        )
    return ids
