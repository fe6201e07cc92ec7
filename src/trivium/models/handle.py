"""What a workflow holds to talk to the rollout model: token ids in, token ids and log-probs out.

The handle fixes the sampling defaults of the run (rollout or eval), renders chat messages with the
tokenizer's own template, and forwards to the shared (batching) rollout model, so that many workflows
running at once are sampled in one batch.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trivium.models.chat import char_budget, last_chars, message_chars, render_ids
from trivium.models.protocol import Generation, SamplingParams, TaskCancelled


class WorkflowTimeoutError(TimeoutError):
    """The workflow ran past ``explorer.workflow_timeout_s``; raised at its next model call."""


class PromptTooLong(ValueError):
    """A prompt fills the model's context (``on_long_row: skip | error`` of its task set); raised by the
    handle before the request reaches the shared engine, so the other tasks of the batch never see it."""

    def __init__(self, length: int, max_length: int, chars: int | None = None):
        self.length, self.max_length = length, max_length
        size = f"{length} tokens" if chars is None else f"{chars} characters (at least {length} tokens)"
        super().__init__(
            f"the prompt has {size} and the model's context is {max_length} (max_position_embeddings)"
        )


LONG_PROMPT_POLICIES = ("skip", "truncate", "error")


class ModelHandle:
    def __init__(
        self,
        model: Any,
        params: SamplingParams,
        order_key: Any = None,
        deadline: float | None = None,
        on_long_prompt: str = "error",
        deadline_set_by: str = "explorer.workflow_timeout_s",
        cancelled: threading.Event | None = None,
    ):
        if on_long_prompt not in LONG_PROMPT_POLICIES:
            raise ValueError(f"on_long_prompt={on_long_prompt!r}: use one of {LONG_PROMPT_POLICIES}")
        self._model = model  # a RolloutModel; BatchingRolloutModel accepts order_key
        self.params = params
        self.order_key = order_key
        self.deadline = deadline  # time.monotonic() after which model calls raise WorkflowTimeoutError
        self.deadline_set_by = deadline_set_by  # what set it, for the error
        self.cancelled = cancelled  # set when the explorer goes ahead without this task (over-rollout)
        self.on_long_prompt = on_long_prompt  # the task set's on_long_row
        self.truncated_prompts = 0  # prompts cut to fit the context (on_long_prompt "truncate")

    @property
    def rollout_model(self) -> Any:
        """The shared rollout model behind this handle (e.g. for an endpoint serving it to an agent)."""
        return self._model

    @property
    def tokenizer(self):
        return self._model.tokenizer

    @property
    def version(self) -> int:
        return self._model.version

    def encode_chat(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the tokenizer's chat template. Messages with more text than
        the context can hold whatever the tokenizer does (``chat.char_budget``) are refused or cut
        (``on_long_row``) before they are tokenised: a huge row costs no tokenising time."""
        limit = self.max_length
        chars = message_chars(messages)
        if limit is not None and chars > (budget := char_budget(self.tokenizer, limit)):
            if self.on_long_prompt != "truncate":
                raise PromptTooLong(limit, limit, chars=chars)
            messages = last_chars(messages, budget)  # still over the context: _fitted cuts its tokens
        return render_ids(self.tokenizer, messages, add_generation_prompt)

    @property
    def max_length(self) -> int | None:
        """The model's context in tokens (prompt + response), when the engine says."""
        return getattr(self._model, "max_length", None)

    @property
    def eos_ids(self) -> set[int]:
        """Token ids that end a response (the engine's; the tokenizer's eos when it does not say)."""
        ids = getattr(self._model, "eos_ids", None)
        if ids is None:
            ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        return set(ids)

    def generate_many(
        self, prompts: Sequence[Sequence[int]], media: Sequence[Any] | None = None, **overrides: Any
    ) -> list[list[Generation]]:
        """``params.n`` samples for each of ``prompts`` in one request (e.g. the episodes of one task
        stepping together); ``out[i]`` belongs to ``prompts[i]``; ``media[i]``: its images
        (``PromptImages``), for a vision-language model."""
        if self.cancelled is not None and self.cancelled.is_set():
            raise TaskCancelled("the explorer went ahead without this task (explorer.over_rollout)")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise WorkflowTimeoutError(
                f"the workflow ran past its time limit ({self.deadline_set_by}); this run is stopped at its "
                "next model call"
            )
        params = dataclasses.replace(self.params, **overrides) if overrides else self.params
        if media is not None and any(m is not None for m in media):
            for p in prompts:  # a cut would drop image placeholders: an image prompt fits or is refused
                if self.max_length is not None and len(p) >= self.max_length:
                    raise PromptTooLong(len(p), self.max_length)
            extra = {"media": list(media)}
        else:
            extra = {}
        prompts = [self._fitted(list(p), params) for p in prompts]
        if not prompts:
            return []
        if self.order_key is not None:
            extra["order_key"] = self.order_key
        return self._model.generate(prompts, params, **extra)

    def _fitted(self, prompt: list[int], params: SamplingParams) -> list[int]:
        """``prompt`` as the task set's ``on_long_row`` has it when it fills the context: refused
        (``PromptTooLong``), or its oldest tokens cut so that the response keeps room for
        ``min(max_tokens, context / 2)`` tokens (the chat template's generation prompt is at the end)."""
        limit = self.max_length
        if limit is None or len(prompt) < limit:
            return prompt
        if self.on_long_prompt != "truncate":
            raise PromptTooLong(len(prompt), limit)
        self.truncated_prompts += 1
        return prompt[-max(1, limit - min(params.max_tokens, limit // 2)) :]

    def generate(self, prompt_ids: Sequence[int], **overrides: Any) -> list[Generation]:
        """``params.n`` samples for one prompt; ``overrides`` replace SamplingParams fields (e.g. n=4)."""
        return self.generate_many([prompt_ids], **overrides)[0]

    def chat(
        self, messages: Sequence[Mapping[str, Any]], images: Sequence[str] = (), **overrides: Any
    ) -> list[Generation]:
        """``params.n`` samples answering ``messages``; ``images``: the references (``ImageStore``) of the
        image parts of the messages, in order (``put_images`` stores them)."""
        if not images:
            return self.generate(self.encode_chat(messages), **overrides)
        vision = self.vision
        ids = vision.expand(self.encode_chat(messages), images)
        return self.generate_many([ids], media=[vision.prompt_images(images)], **overrides)[0]

    @property
    def vision(self):
        """The rollout model's ``VisionProcessor``; an error naming the fix when it takes no images."""
        vision = getattr(self._model, "vision", None)
        if vision is None:
            raise ValueError(
                "this task has images and the rollout model takes none: use a vision-language model "
                "(model.path a folder with a vision_config and preprocessor_config.json, e.g. from "
                "`trivium make-tiny --vlm`) with explorer.rollout.engine_type: transformers"
            )
        return vision

    @property
    def takes_images(self) -> bool:
        """Whether the rollout model is a vision-language model (has a ``VisionProcessor``)."""
        return getattr(self._model, "vision", None) is not None

    def put_images(self, images: Sequence[Any], where: str) -> tuple[str, ...]:
        """Check and store ``images`` (paths, bytes, data URLs, arrays); their references, in order."""
        return self.vision.put(images, where)
