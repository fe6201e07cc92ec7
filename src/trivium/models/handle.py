"""What a workflow holds to talk to the rollout model: token ids in, token ids and log-probs out.

The handle fixes the sampling defaults of the run (rollout or eval), renders chat messages with the
tokenizer's own template, and forwards to the shared (batching) rollout model, so that many workflows
running at once are sampled in one batch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trivium.models.chat import render_ids
from trivium.models.protocol import Generation, SamplingParams


class WorkflowTimeoutError(TimeoutError):
    """The workflow ran past ``explorer.workflow_timeout_s``; raised at its next model call."""


class ModelHandle:
    def __init__(
        self, model: Any, params: SamplingParams, order_key: Any = None, deadline: float | None = None
    ):
        self._model = model  # a RolloutModel; BatchingRolloutModel accepts order_key
        self.params = params
        self.order_key = order_key
        self.deadline = deadline  # time.monotonic() after which model calls raise WorkflowTimeoutError

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
        """Token ids of ``messages`` rendered by the tokenizer's chat template."""
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

    def generate_many(self, prompts: Sequence[Sequence[int]], **overrides: Any) -> list[list[Generation]]:
        """``params.n`` samples for each of ``prompts`` in one request (e.g. the episodes of one task
        stepping together); ``out[i]`` belongs to ``prompts[i]``."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise WorkflowTimeoutError(
                "the workflow ran past explorer.workflow_timeout_s; this run is stopped at its next model call"
            )
        params = dataclasses.replace(self.params, **overrides) if overrides else self.params
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        if self.order_key is None:
            return self._model.generate(prompts, params)
        return self._model.generate(prompts, params, order_key=self.order_key)

    def generate(self, prompt_ids: Sequence[int], **overrides: Any) -> list[Generation]:
        """``params.n`` samples for one prompt; ``overrides`` replace SamplingParams fields (e.g. n=4)."""
        return self.generate_many([prompt_ids], **overrides)[0]

    def chat(self, messages: Sequence[Mapping[str, str]], **overrides: Any) -> list[Generation]:
        return self.generate(self.encode_chat(messages), **overrides)
