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
  as vLLM does; send token ids for exact control. Chat messages never are: their text is text
  (``models/chat.py``), so a caller cannot forge turns in the recorded data.
- Limits (``limits.py``): ``n`` up to ``max_n``; ``max_tokens`` lowered to ``limits.max_tokens`` and to the
  room left in the context (OpenAI refuses instead; lowering keeps agents written for bigger models
  working, and ``finish_reason: "length"`` says so); ``top_k`` at most the vocabulary. A prompt whose
  characters cannot fit the context however they are tokenised (more than context x the longest token's
  characters) is refused before it is rendered or tokenised, so a multi-megabyte message costs no
  tokenizer memory. Generation runs in fair turns of at most ``split_n`` samples (``FairGate``).
- ``seed``: the request is sampled by the engine directly with a generator seeded for it (turn k of a
  split request uses a seed derived from ``(seed, k)``), not merged into a batch with other requests, so
  the same seed, prompt, parameters and weights give the same choices whatever else the server is doing.
  An engine without per-request seeds (vLLM here) refuses the field (400).
- A streamed request is generated, recorded and built like a plain one, then replayed as chunks
  (``responses.chat_stream``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi.responses import StreamingResponse
from jinja2 import TemplateError as JinjaTemplateError

from trivium.models.protocol import Generation, SamplingParams
from trivium.serve.limits import FairGate, ServeLimits, ServerBusy
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
from trivium.serve.runner import Runner
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
        self,
        model: Any,
        model_name: str,
        recorder: Recorder | None,
        defaults: SamplingParams | None,
        limits: ServeLimits | None = None,
    ):
        self.model, self.model_name, self.recorder = model, model_name, recorder
        self.limits = limits or ServeLimits()
        self.tokenizer = model.tokenizer
        self.engine = getattr(model, "engine", model)  # BatchingRolloutModel wraps an engine
        self.context = int(getattr(self.engine, "max_length", 0) or self.tokenizer.model_max_length)
        self.vocab_size = int(getattr(self.engine, "vocab_size", 0) or len(self.tokenizer))
        self.eos_ids = tuple(getattr(self.engine, "eos_ids", ()))
        self.defaults = defaults or SamplingParams(max_tokens=self.context, include_stop_str_in_output=False)
        self.started = int(time.time())
        # A bare engine runs one call at a time anyway: one slot makes the waiting line strictly FIFO.
        self.gate = FairGate(self.limits.max_concurrent if self.engine is not model else 1)
        self.seeded = "seed" in inspect.signature(self.engine.generate).parameters
        self.runner = Runner(model)  # started by OpenAIServer: generation off the request threads
        self.token_chars = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
        self.vision = getattr(model, "vision", None)  # a vision-language model's image processor and store

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
        """The request's sampling parameters over the defaults, within the limits (see the docstring)."""
        overrides: dict[str, Any] = {}
        for name in ("n", "temperature", "top_p", "top_k"):
            if getattr(body, name) is not None:
                overrides[name] = getattr(body, name)
        if overrides.get("n", 1) > self.limits.max_n:
            raise RequestError(
                f"n: {overrides['n']} choices asked, this server samples at most {self.limits.max_n} per "
                "request (serve.max_n); send several requests",
                param="n",
            )
        if overrides.get("top_k", 0) > self.vocab_size:
            raise RequestError(
                f"top_k: {overrides['top_k']} is more than the model's vocabulary ({self.vocab_size} tokens); "
                "use at most that, or 0 to turn top-k off",
                param="top_k",
            )
        cap = min(self.limits.max_tokens or self.context, self.context)
        overrides["max_tokens"] = min(max_tokens if max_tokens is not None else self.defaults.max_tokens, cap)
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

    def check_length(self, chars: int, param: str) -> None:
        """Refuse text that cannot fit the context however it is tokenised (before tokenising it)."""
        if chars > self.context * self.token_chars:
            raise RequestError(
                f"{param}: {chars} characters are more than {self.context} tokens (the model's context) of at "
                f"most {self.token_chars} characters each; shorten the prompt",
                param=param,
            )

    def generate(
        self, ids: list[int], params: SamplingParams, seed: int | None = None, images: Sequence[str] = ()
    ) -> tuple[int, list]:
        """``params.n`` generations of ``ids`` in fair turns of at most ``split_n`` (see ``limits.py``);
        returns the weights version and the generations. A split request whose turns saw different weights
        versions is refused (503): its choices would not come from one policy."""
        if seed is not None and not self.seeded:
            raise RequestError(
                f"seed: the {type(self.engine).__name__} engine samples with its own generator, not per request; "
                "leave seed unset",
                param="seed",
            )
        started, gens, versions = time.monotonic(), [], set()
        one = dataclasses.replace(params, n=1)
        for turn, first in enumerate(range(0, params.n, self.limits.split_n)):
            if time.monotonic() - started > self.limits.request_timeout_s:
                raise RequestError(
                    f"the request took more than {self.limits.request_timeout_s:g} s (serve.request_timeout_s) "
                    f"after {len(gens)} of {params.n} choices; ask for fewer choices or tokens",
                    status=504,
                )
            rows = [ids] * min(self.limits.split_n, params.n - first)
            try:
                with self.gate.turn(self.limits.queue_timeout_s):
                    versions.add(self.model.version)
                    out = self._call(rows, one, None if seed is None else _turn_seed(seed, turn), images)
            except ServerBusy:
                raise RequestError(
                    f"the server is busy: no turn to generate within {self.limits.queue_timeout_s:g} s "
                    "(serve.queue_timeout_s); retry later",
                    status=503,
                    kind="server_busy",
                ) from None
            gens += [g[0] for g in out]
        if len(versions) > 1:
            raise RequestError(
                f"the weights were updated while this request's {params.n} choices were sampled (versions "
                f"{sorted(versions)}); retry it",
                status=503,
                kind="server_busy",
            )
        return versions.pop(), gens

    def _call(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None, images: Sequence[str] = ()
    ) -> list:
        extra = {"media": [self.vision.prompt_images(images)] * len(prompts)} if images else {}
        if seed is not None:
            return self.runner.direct(self.engine.generate, prompts, params, seed=seed, **extra)
        if self.engine is self.model:
            return self.runner.direct(self.model.generate, prompts, params, **extra)
        return self.model.generate(prompts, params, **extra)  # queued; the runner's driver thread runs it

    def store_images(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with each ``image_url`` part read, checked and stored (``ImageStore``), and replaced
        by ``{"type": "image", "image": <reference>}``: the template form the recorder compares, a few
        bytes in recorded calls. Only data URLs are read (a server that fetched URLs for its callers could
        be made to reach any address it can); a bad image is a 400 naming its part."""
        from trivium.models.vision import ImageError, load_image

        out = []
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, list):
                out.append(message)
                continue
            parts = []
            for k, part in enumerate(content):
                if part.get("type") != "image_url":
                    parts.append(part)
                    continue
                param = f"messages[{i}].content[{k}]"
                if self.vision is None:
                    raise RequestError(
                        f"{param}: this server's model takes no images (a text model); send text only, or "
                        "serve a vision-language model",
                        param=param,
                    )
                url = part["image_url"]["url"]
                if not url.startswith("data:"):
                    raise RequestError(
                        f"{param}: image URLs other than data URLs are not fetched by this server; send the "
                        "image inline as data:image/png;base64,...",
                        param=param,
                    )
                try:
                    image = load_image(url, param)
                except ImageError as exc:
                    raise RequestError(str(exc), param=param) from None
                parts.append({"type": "image", "image": self.vision.store.put(image)})
            out.append({**message, "content": parts})
        return out

    def chat_prompt(
        self,
        session: RecordingSession | None,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> ChatPrompt:
        """The checked prompt: continued from the session's transcripts where possible (see recorder.py)."""
        try:
            if session is not None:
                prompt = session.prepare_chat(self.tokenizer, messages, tools, self.eos_ids, self.vision)
            else:
                prompt = render_chat(self.tokenizer, messages, tools, self.eos_ids, self.vision)
        except (JinjaTemplateError, ValueError, TypeError, KeyError) as exc:
            raise RequestError(
                f"messages: the chat template cannot render this conversation: {type(exc).__name__}: {exc}",
                param="messages",
            ) from None
        self.check_prompt(prompt.ids, "messages")
        return prompt

    def chat(self, body: ChatCompletionRequest, session_id: str | None) -> Any:
        session = self.session(session_id)
        messages = self.store_images([m.template() for m in body.messages])
        tools = [t.schema_entry() for t in body.tools] if body.tools else None
        params = self.params(body, body.response_tokens)
        self.check_length(sum(len(s) for s in _strings((messages, tools))), "messages")
        prompt = self.chat_prompt(session, messages, tools)
        version, gens = self.generate(prompt.ids, params, body.seed, prompt.transcript.images)
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
        params = self.params(body, body.max_tokens)
        if isinstance(body.prompt, str):
            self.check_length(len(body.prompt), "prompt")
            ids = list(self.tokenizer(body.prompt)["input_ids"])
        else:
            ids = list(body.prompt)
        self.check_prompt(ids, "prompt")
        version, gens = self.generate(ids, params, body.seed)
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
        images=tuple(prompt.transcript.images),
    )


def _turn_seed(seed: int, turn: int) -> int:
    """The seed of turn ``turn`` of a split request: ``seed`` itself for the first, then a fixed mix."""
    return (seed + turn * 0x9E3779B97F4A7C15) % 2**64


def _strings(value: Any) -> Iterator[str]:
    """Every string in nested dicts and lists (keys too), without recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack += [*node.keys(), *node.values()]
        elif isinstance(node, (list, tuple)):
            stack += node


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
