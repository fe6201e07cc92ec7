"""A recorded call (``RecordedCall``, what the recorder keeps of one request through the endpoint) and its
experiences: one per reply (``step``) or one per session (``concat``).

``concat`` lays the session out as the conversation the model saw: the first prompt, then for every call
its sampled ids (action mask True, engine log-probs) and, between calls, the tokens the next prompt adds
(the environment's: template glue, tool results, user turns; mask False, log-prob 0). It requires each
prompt to start with the previous prompt and reply, which the recorder's prefix reuse guarantees for an
agent that sends its history back unchanged; see ``recorder.py`` for why a mismatch raises.

The experience's ``model_version`` is the oldest version among the merged calls: a run that filters
stale experiences by version then never keeps one that is staler than it says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from trivium.types import Experience

__all__ = ["RecordedCall", "RecordedChoice", "concat_experience", "step_experiences"]


@dataclass(frozen=True)
class RecordedChoice:
    """One sampled reply of a call: ids and fp32 log-probs as the engine produced them."""

    index: int
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # OpenAI's: "stop", "length" or "tool_calls"
    text: str  # the decoded reply (special tokens skipped, cut at a stop string)
    tool_calls: tuple[Mapping[str, Any], ...] = ()  # OpenAI ``tool_calls`` entries returned
    message: Mapping[str, Any] = field(default_factory=dict)  # chat: the assistant message, template form


@dataclass(frozen=True)
class RecordedCall:
    """One request through the endpoint. ``choices`` holds its ``n`` replies.

    Chat calls have ``messages`` (template form) and ``tools``; completion calls have ``prompt`` (text or
    ids). The single-reply accessors (``response_ids``, ``logprobs``, ``text``, ``finish_reason``,
    ``tool_calls``) raise for ``n > 1``, where they would silently pick one reply.
    """

    call_id: str  # the response's ``id``
    session_id: str | None
    kind: Literal["chat", "completion"]
    prompt_ids: tuple[int, ...]
    choices: tuple[RecordedChoice, ...]
    model_version: int
    created: float  # unix seconds
    messages: tuple[Mapping[str, Any], ...] | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None
    prompt: str | tuple[int, ...] | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # the SamplingParams used, as a dict
    prefix_reused: bool = False
    images: tuple[str, ...] = ()  # the prompt's images (ImageStore references, in placeholder order)
    continued_call_id: str | None = None  # the call whose transcript the prompt continued

    @property
    def only(self) -> RecordedChoice:
        if len(self.choices) != 1:
            raise ValueError(
                f"call {self.call_id} has {len(self.choices)} choices (n > 1): read call.choices[j] instead"
            )
        return self.choices[0]

    @property
    def response_ids(self) -> tuple[int, ...]:
        return self.only.response_ids

    @property
    def logprobs(self) -> tuple[float, ...]:
        return self.only.logprobs

    @property
    def text(self) -> str:
        return self.only.text

    @property
    def finish_reason(self) -> str:
        return self.only.finish_reason

    @property
    def tool_calls(self) -> tuple[Mapping[str, Any], ...]:
        return self.only.tool_calls


def step_experiences(
    session_id: str, calls: Sequence[RecordedCall], *, reward: float, task_id: str, run_index: int
) -> list[Experience]:
    out = []
    for turn, call in enumerate(calls):
        for choice in call.choices:
            n = len(choice.response_ids)
            out.append(
                Experience(
                    tokens=torch.tensor([*call.prompt_ids, *choice.response_ids], dtype=torch.long),
                    prompt_length=len(call.prompt_ids),
                    action_mask=torch.ones(n, dtype=torch.bool),
                    logprobs=torch.tensor(choice.logprobs, dtype=torch.float32),
                    reward=reward,
                    task_id=task_id,
                    run_index=run_index,
                    turn=turn,
                    model_version=call.model_version,
                    info={
                        "session_id": session_id,
                        "call_ids": [call.call_id],
                        "choice": choice.index,
                        "texts": [choice.text],
                        "finish_reasons": [choice.finish_reason],
                        "prefix_reused": [call.prefix_reused],
                    },
                    metrics={"num_calls": float(len(calls)), "response_length": float(n)},
                    images=call.images,
                )
            )
    return out


def concat_experience(
    session_id: str, calls: Sequence[RecordedCall], *, reward: float, task_id: str, run_index: int
) -> Experience:
    multi = [c.call_id for c in calls if len(c.choices) != 1]
    if multi:
        raise ValueError(
            f"session {session_id!r}: concat needs one reply per call, but calls {multi} have n > 1; "
            "use mode='step'"
        )
    tokens = list(calls[0].prompt_ids)
    mask: list[bool] = []
    logprobs: list[float] = []
    for k, call in enumerate(calls):
        prompt = list(call.prompt_ids)
        if prompt[: len(tokens)] != tokens:
            j = next(
                (i for i, (a, b) in enumerate(zip(tokens, prompt)) if a != b), min(len(tokens), len(prompt))
            )
            raise ValueError(
                f"session {session_id!r}: call {k} ({call.call_id}) does not continue call {k - 1} "
                f"({calls[k - 1].call_id}): its prompt ({len(prompt)} tokens) differs from the previous prompt "
                f"and reply ({len(tokens)} tokens) at token {j} (prefix_reused={call.prefix_reused}). The agent "
                "edited or dropped earlier messages, or made a side call; use mode='step'"
            )
        between = len(prompt) - len(tokens)
        mask += [False] * between
        logprobs += [0.0] * between
        reply = call.only
        tokens = prompt + list(reply.response_ids)
        mask += [True] * len(reply.response_ids)
        logprobs += list(reply.logprobs)
    return Experience(
        tokens=torch.tensor(tokens, dtype=torch.long),
        prompt_length=len(calls[0].prompt_ids),
        action_mask=torch.tensor(mask, dtype=torch.bool),
        logprobs=torch.tensor(logprobs, dtype=torch.float32),
        reward=reward,
        task_id=task_id,
        run_index=run_index,
        model_version=min(c.model_version for c in calls),
        info={
            "session_id": session_id,
            "call_ids": [c.call_id for c in calls],
            "texts": [c.text for c in calls],
            "finish_reasons": [c.finish_reason for c in calls],
            "prefix_reused": [c.prefix_reused for c in calls],
        },
        metrics={"num_calls": float(len(calls)), "response_length": float(sum(mask))},
        images=calls[-1].images,  # every prompt extends the one before: the last one holds every image
    )
