"""What the endpoints do, apart from HTTP: validate, render, generate, build the response, record.

Design decisions:
- Requests are fully validated (prompt length against the context, token ids against the vocabulary,
  sampling values) before they reach the model: with a batching model an engine error fails every
  request of the batch, so one agent's bad request must never get that far.
- ``model.version`` is read on every request, just before generating, so in-place weight updates
  (``model.update_weights``) show in ``/health``, in responses (``model_version``) and in recorded calls.
  An update landing between that read and the batch start makes a call look one version older, never newer.
- Defaults follow the OpenAI API where it defines them: an unset ``max_tokens`` means until the context is
  full, stop strings are not included in the text (the token that completed one stays in ``token_ids``),
  ``temperature`` 1. ``default_params`` replaces these defaults for every field a request leaves unset.
- String prompts of ``/v1/completions`` are tokenised with the tokenizer's special tokens (e.g. a BOS),
  as vLLM does; send token ids for exact control.
- A streamed request is generated, recorded and built like a plain one, then replayed as chunks
  (``responses.chat_stream``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from fastapi.responses import StreamingResponse
from jinja2 import TemplateError as JinjaTemplateError

from trivium.models.protocol import Generation, SamplingParams
from trivium.serve.recorder import (
    ChatPrompt,
    RecordedCall,
    RecordedChoice,
    Recorder,
    RecordingSession,
    new_call_id,
    render_chat,
)
from trivium.serve.responses import ChatTurn, chat_choice, chat_stream, completion_choice, completion_stream
from trivium.serve.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    RequestError,
    Usage,
)

__all__ = ["Service", "chat_call"]

log = logging.getLogger(__name__)


class Service:
    """What the endpoints do, apart from HTTP: validate, render, generate, build the response, record."""

    def __init__(
        self, model: Any, model_name: str, recorder: Recorder | None, defaults: SamplingParams | None
    ):
        self.model, self.model_name, self.recorder = model, model_name, recorder
        self.tokenizer = model.tokenizer
        engine = getattr(model, "engine", model)  # BatchingRolloutModel wraps an engine
        self.context = int(getattr(engine, "max_length", 0) or self.tokenizer.model_max_length)
        self.vocab_size = int(getattr(engine, "vocab_size", 0) or len(self.tokenizer))
        self.eos_ids = tuple(getattr(engine, "eos_ids", ()))
        self.defaults = defaults or SamplingParams(max_tokens=self.context, include_stop_str_in_output=False)
        self.started = int(time.time())

    def session(self, session_id: str | None) -> RecordingSession | None:
        if self.recorder is None:
            if session_id is None:
                return None
            raise RequestError(
                "this server records no sessions (it was created without a recorder); use /v1/... or pass "
                "recorder=Recorder()",
                param="session_id",
                status=404,
            )
        try:
            return self.recorder.get(session_id)
        except LookupError as exc:
            raise RequestError(str(exc), param="session_id", status=404) from None

    def params(self, body: Any, max_tokens: int | None) -> SamplingParams:
        overrides: dict[str, Any] = {}
        for name in ("n", "temperature", "top_p", "top_k"):
            if getattr(body, name) is not None:
                overrides[name] = getattr(body, name)
        if max_tokens is not None:
            overrides["max_tokens"] = max_tokens
        if body.stop:
            overrides["stop"] = tuple(body.stop)
        try:
            return dataclasses.replace(self.defaults, **overrides)
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    def check_prompt(self, ids: Sequence[int], param: str) -> None:
        if not ids:
            raise RequestError(f"{param}: the prompt renders to no tokens", param=param)
        if len(ids) >= self.context:
            raise RequestError(
                f"{param}: the prompt has {len(ids)} tokens but the model's context is {self.context} tokens "
                "(room is needed for at least one response token); shorten the prompt",
                param=param,
            )
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise RequestError(
                f"{param}: token ids must be in [0, {self.vocab_size}) (the model's vocabulary), got "
                f"[{min(ids)}, {max(ids)}]; was the prompt tokenised with another tokenizer?",
                param=param,
            )

    def generate(self, ids: list[int], params: SamplingParams) -> tuple[int, list]:
        version = self.model.version
        return version, self.model.generate([ids], params)[0]

    def chat_prompt(
        self,
        session: RecordingSession | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> ChatPrompt:
        """The checked prompt: continued from the session's transcripts where possible (see recorder.py)."""
        try:
            if session is not None:
                prompt = session.prepare_chat(self.tokenizer, messages, tools, self.eos_ids)
            else:
                prompt = render_chat(self.tokenizer, messages, tools, self.eos_ids)
        except (JinjaTemplateError, ValueError, TypeError, KeyError) as exc:
            raise RequestError(
                f"messages: the chat template cannot render this conversation: {type(exc).__name__}: {exc}",
                param="messages",
            ) from None
        self.check_prompt(prompt.ids, "messages")
        return prompt

    def chat(self, body: ChatCompletionRequest, session_id: str | None) -> Any:
        session = self.session(session_id)
        messages = [m.template() for m in body.messages]
        tools = [t.schema_entry() for t in body.tools] if body.tools else None
        prompt = self.chat_prompt(session, messages, tools)
        params = self.params(body, body.response_tokens)
        version, gens = self.generate(prompt.ids, params)
        call_id = new_call_id("chat")
        turns = [
            chat_choice(
                g,
                j,
                self.tokenizer,
                parse_tools=body.parse_tools,
                logprobs=body.logprobs,
                call_prefix=f"call_{call_id[-8:]}",
            )
            for j, g in enumerate(gens)
        ]
        created = time.time()
        response = ChatCompletionResponse(
            id=call_id,
            created=int(created),
            model=self.model_name,
            choices=[t.choice for t in turns],
            usage=_usage(prompt.ids, gens),
            prompt_token_ids=prompt.ids,
            model_version=version,
            prefix_reused=prompt.prefix_reused,
        )
        if session is not None:
            call = chat_call(
                call_id,
                session.session_id,
                prompt,
                gens,
                turns,
                messages=messages,
                tools=tools,
                params=params,
                version=version,
                created=created,
            )
            _record(session, call, gens, prompt)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _sse(chat_stream(response, self.tokenizer, include_usage))
        return response

    def completion(self, body: CompletionRequest, session_id: str | None) -> Any:
        session = self.session(session_id)
        if isinstance(body.prompt, str):
            ids = list(self.tokenizer(body.prompt)["input_ids"])
        else:
            ids = list(body.prompt)
        self.check_prompt(ids, "prompt")
        params = self.params(body, body.max_tokens)
        version, gens = self.generate(ids, params)
        call_id = new_call_id("completion")
        logprobs = body.logprobs is not None
        created = time.time()
        response = CompletionResponse(
            id=call_id,
            created=int(created),
            model=self.model_name,
            choices=[completion_choice(g, j, self.tokenizer, logprobs=logprobs) for j, g in enumerate(gens)],
            usage=_usage(ids, gens),
            prompt_token_ids=ids,
            model_version=version,
        )
        if session is not None:
            choices = tuple(
                RecordedChoice(j, g.response_ids, g.logprobs, c.finish_reason, g.text)
                for j, (g, c) in enumerate(zip(gens, response.choices))
            )
            prompt = body.prompt if isinstance(body.prompt, str) else tuple(body.prompt)
            call = RecordedCall(
                call_id=call_id,
                session_id=session.session_id,
                kind="completion",
                prompt_ids=tuple(ids),
                choices=choices,
                model_version=version,
                created=created,
                prompt=prompt,
                params=dataclasses.asdict(params),
            )
            _record(session, call, gens, None)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _sse(completion_stream(response, self.tokenizer, include_usage))
        return response


def chat_call(
    call_id: str,
    session_id: str | None,
    prompt: ChatPrompt,
    gens: Sequence[Generation],
    turns: Sequence[ChatTurn],
    *,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    params: SamplingParams,
    version: int,
    created: float,
) -> RecordedCall:
    """The record of a chat request: its template-form messages, prompt ids and one choice per reply."""
    choices = tuple(
        RecordedChoice(
            index=j,
            response_ids=g.response_ids,
            logprobs=g.logprobs,
            finish_reason=t.choice.finish_reason,
            text=g.text,
            tool_calls=tuple(c.model_dump() for c in t.choice.message.tool_calls or ()),
            message=t.message,
        )
        for j, (g, t) in enumerate(zip(gens, turns))
    )
    return RecordedCall(
        call_id=call_id,
        session_id=session_id,
        kind="chat",
        prompt_ids=tuple(prompt.ids),
        choices=choices,
        model_version=version,
        created=created,
        messages=tuple(messages),
        tools=tuple(tools) if tools else None,
        params=dataclasses.asdict(params),
        prefix_reused=prompt.prefix_reused,
        continued_call_id=prompt.continued_call_id,
    )


def _usage(prompt_ids: Sequence[int], gens: Sequence[Any]) -> Usage:
    completion = sum(len(g.response_ids) for g in gens)
    return Usage(
        prompt_tokens=len(prompt_ids), completion_tokens=completion, total_tokens=len(prompt_ids) + completion
    )


def _record(session: RecordingSession, call: RecordedCall, gens: Sequence[Any], prompt: Any) -> None:
    try:
        session.record(call, gens, prompt)
    except Exception as exc:
        log.exception("recording call %s of session %s failed", call.call_id, session.session_id)
        raise RequestError(
            f"the reply was generated but recording it failed ({type(exc).__name__}: {exc}); the call was not "
            "recorded, retry the request",
            status=500,
        ) from exc


def _sse(events: Any) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
