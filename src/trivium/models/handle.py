"""What a workflow holds to talk to the rollout model: token ids in, token ids and log-probs out.

The handle fixes the sampling defaults of the run (rollout or eval), renders chat messages with the
tokenizer's own template, and forwards to the shared (batching) rollout model, so that many workflows
running at once are sampled in one batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trivium.models.protocol import Generation, SamplingParams


class ModelHandle:
    def __init__(self, model: Any, params: SamplingParams, order_key: Any = None):
        self._model = model  # a RolloutModel; BatchingRolloutModel accepts order_key
        self.params = params
        self.order_key = order_key

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
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompt_ids: Sequence[int], **overrides: Any) -> list[Generation]:
        """``params.n`` samples for one prompt; ``overrides`` replace SamplingParams fields (e.g. n=4)."""
        params = dataclasses.replace(self.params, **overrides) if overrides else self.params
        if self.order_key is None:
            return self._model.generate([list(prompt_ids)], params)[0]
        return self._model.generate([list(prompt_ids)], params, order_key=self.order_key)[0]

    def chat(self, messages: Sequence[Mapping[str, str]], **overrides: Any) -> list[Generation]:
        return self.generate(self.encode_chat(messages), **overrides)
