"""Request and response bodies of the OpenAI-compatible endpoint: only the fields the engine supports.

Design decisions:
- Unknown request fields are ignored (``extra="ignore"``): agents and SDKs send many optional fields
  (``user``, ``store``, ``metadata``, ...) that change nothing a trainer cares about. ``seed`` is honoured
  (``service.py``); ``response_format`` other than ``{"type": "text"}`` is refused (nothing constrains
  decoding to JSON, and a reply that ignores the format silently would break the agent later).
- Every number is bounded (finite floats; ints that fit the engine): the values a request may really ask
  for depend on the model and the server's limits, and are checked in ``service.py`` with the reason.
  ``temperature`` is 0 (greedy) or at least ``MIN_TEMPERATURE``: smaller ones overflow the scaled logits.
- Known fields whose non-default value would change what the response *means* are refused with a 400
  naming the field (``top_logprobs > 0``, penalties, ``logit_bias``, ``echo``, ``best_of``, a forced
  ``tool_choice``): silently ignoring them would give the agent log-probs or samples that are not what
  it asked for, and the trainer would learn from a distribution nobody sampled.
- The ``model`` field is accepted whatever it says: an agent is usually configured with some model name,
  and one server serves one policy. Responses carry the server's own ``model_name``.
- Messages are normalised for the chat template (:meth:`ChatMessage.template`): text parts joined, the
  ``developer`` role rendered as ``system``, ``content: null`` as ``""`` (Jinja would print ``None``),
  tool-call arguments as a mapping (what Hugging Face templates expect). The recorder compares messages in
  this normal form, so an agent that sends back the assistant message it received is recognised.
- Responses are pydantic models with the OpenAI field names plus trivium extensions: ``token_ids`` per
  choice, ``prompt_token_ids``, ``model_version`` and ``prefix_reused`` at the top level. The OpenAI
  clients keep unknown fields, so ``completion.choices[0].token_ids`` works there too.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trivium.config.schema import MIN_TEMPERATURE
from trivium.tools.calls import Tool

__all__ = [
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorResponse",
    "RequestError",
]


class RequestError(ValueError):
    """A request the server cannot serve: becomes ``{"error": {...}}`` with ``status`` (400 by default)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, kind: str = ""):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")


def _refuse_if(value: Any, refused: bool, fix: str) -> Any:
    """``value`` unless ``refused``: then a ValueError naming the fix (see the module docstring)."""
    if refused:
        raise ValueError(f"not supported: {fix}")
    return value


INT32_MAX = 2**31 - 1  # larger counts are nonsense for any engine
MAX_STOPS, MAX_STOP_CHARS = 16, 1000


class _Request(BaseModel):
    # strict: a value of the wrong JSON type is refused naming its field ("n": "3", "stream": "yes" were
    # coerced); a number is still accepted where a float is asked
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


# ------------------------------------------------------------------------------------------ chat requests
class FunctionCallIn(_Request):
    name: str
    arguments: str | dict[str, Any] = "{}"

    @field_validator("arguments")
    @classmethod
    def _object(cls, value: str | dict[str, Any]) -> dict[str, Any]:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"must be a JSON object (as a string); not JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ValueError(f"must be a JSON object, got {type(value).__name__}")
        return value


class ToolCallIn(_Request):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


def _image_url(value: Any) -> str | None:
    """The URL of an ``image_url`` part: ``{"url": ...}`` (OpenAI) or a bare string."""
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # str, a list of {"type": "text", "text": str} and {"type": "image_url", "image_url": {"url": str}} parts
    # (images: a vision-language model), or null (assistant only)
    content: Any = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: Any) -> str | list[dict[str, Any]] | None:
        """Text parts joined into a string; with image parts, the parts in order (text, then image_url
        parts holding their URL), which ``service.py`` turns into stored images."""
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            parts: list[dict[str, Any]] = []
            for k, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                elif kind == "image_url" and isinstance(url := _image_url(part.get("image_url")), str):
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                else:
                    raise ValueError(
                        f"part {k} must be {{'type': 'text', 'text': str}} or {{'type': 'image_url', "
                        "'image_url': {'url': 'data:image/png;base64,...'}}"
                    )
            if all(p["type"] == "text" for p in parts):
                return "\n".join(p["text"] for p in parts)
            return parts
        raise ValueError(
            f"must be a string, a list of text and image parts or null, got {type(value).__name__}"
        )

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                f"content is required for a {self.role} message (null only for assistant tool calls)"
            )
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role} messages")
        return self

    def template(self) -> dict[str, Any]:
        """The message as the chat template gets it (see the module docstring); also its identity."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.content or "",
        }
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class FunctionSpec(_Request):
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


class ToolSpec(_Request):
    type: Literal["function"] = "function"
    function: FunctionSpec

    @model_validator(mode="after")
    def _valid(self) -> ToolSpec:
        Tool.from_schema(self.schema_entry())  # raises ValueError naming the problem
        return self

    def schema_entry(self) -> dict[str, Any]:
        spec = self.function
        parameters = spec.parameters if spec.parameters is not None else {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {"name": spec.name, "description": spec.description, "parameters": parameters},
        }


class StreamOptions(_Request):
    include_usage: bool = False


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(data: Any) -> str | None:
    """The path of the first string in ``data`` holding a lone UTF-16 surrogate (JSON allows ``"\\ud800"``,
    but no UTF-8 text holds one, and the tokenizer raises on it), or None."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str) and _SURROGATE.search(node):
            return path or "body"
        if isinstance(node, dict):
            stack += [(f"{path}.{k}" if path else str(k), v) for k, v in node.items()]
            stack += [(path or "body", k) for k in node if isinstance(k, str)]
        elif isinstance(node, list):
            stack += [(f"{path}.{i}" if path else str(i), v) for i, v in enumerate(node)]
    return None


class _Sampling(_Request):
    """Fields shared by both endpoints; ``None`` means the server's default (``default_params``)."""

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data: Any) -> Any:
        where = _lone_surrogate(data)
        if where is not None:
            raise ValueError(
                f"{where} holds a lone UTF-16 surrogate (an escape like \\ud800 without its pair), which is not "
                "text; send valid Unicode"
            )
        return data

    model: str | None = None
    n: int | None = Field(None, ge=1, le=INT32_MAX)  # the server's cap: serve.max_n
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)  # extension (as in vLLM); 0 turns it off
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    response_format: Any = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters each")
        return stops

    @field_validator("temperature")
    @classmethod
    def _not_tiny(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(
                f"must be 0 (greedy) or at least {MIN_TEMPERATURE}: smaller temperatures overflow the logits"
            )
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else value
        return _refuse_if(
            value,
            kind not in (None, "text"),
            f"response_format {kind!r:.60}: decoding is not constrained to JSON; leave it unset or "
            "{'type': 'text'} and parse the reply yourself",
        )

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        return _refuse_if(
            value, bool(value), "the engine samples from the model's own distribution; leave it unset or 0"
        )

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return _refuse_if(
            value, bool(value), "the engine samples from the model's own distribution; leave it unset"
        )


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    tools: list[ToolSpec] | None = None
    tool_choice: Any = None  # "auto" | "none"; forcing a call is refused
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("top_logprobs")
    @classmethod
    def _no_alternatives(cls, value: int | None) -> int | None:
        return _refuse_if(
            value,
            bool(value),
            "the engine reports only the sampled tokens' log-probs (logprobs=true); use 0 or leave it unset",
        )

    @field_validator("tool_choice")
    @classmethod
    def _not_forced(cls, value: Any) -> Any:
        forced = value not in (None, "auto", "none")
        return _refuse_if(value, forced, "decoding cannot be forced to call a tool; use 'auto' or 'none'")

    @property
    def response_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def parse_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_Sampling):
    prompt: Any  # a string or a list of token ids; a one-element batch of either is unwrapped
    logprobs: int | None = Field(None, ge=0, le=20)  # 0 (or true): return the sampled tokens' log-probs
    echo: bool = False
    best_of: int | None = Field(None, le=INT32_MAX)
    suffix: str | None = None

    @field_validator("logprobs", mode="before")
    @classmethod
    def _bool_logprobs(cls, value: Any) -> Any:
        return {True: 0, False: None}.get(value, value) if isinstance(value, bool) else value

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            value = value[0]
        if isinstance(value, str):
            if not value:
                raise ValueError("must not be empty")
            return value
        if isinstance(value, list) and value and all(type(t) is int for t in value):
            if min(value) < 0:
                raise ValueError("token ids must be >= 0")
            return value
        if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
            raise ValueError(f"holds {len(value)} prompts; send one prompt per request")
        raise ValueError("must be a non-empty string or a non-empty list of token ids")

    @field_validator("logprobs")
    @classmethod
    def _no_top(cls, value: int | None) -> int | None:
        return _refuse_if(value, bool(value), "the engine reports only the sampled tokens' log-probs; use 0")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        return _refuse_if(value, value, "the response's prompt_token_ids hold the prompt; leave it false")

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        return _refuse_if(value, value not in (None, 1), "use n for more samples; leave it unset or 1")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        return _refuse_if(value, bool(value), "insertion is not supported; leave it unset")


# ------------------------------------------------------------------------------------------ responses
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TokenLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int]  # extension: the sampled token ids
    tool_call_errors: list[str] | None = None  # extension: malformed <tool_call> blocks (content keeps them)


class _Response(BaseModel):
    id: str  # the recorded call id
    created: int
    model: str
    usage: Usage
    prompt_token_ids: list[int]  # extension
    model_version: int  # extension: weights version read before generating


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    prefix_reused: bool = False  # extension: the prompt continued an earlier call's tokens


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    text_offset: list[int]  # character offset of each token in the completion text
    top_logprobs: list[dict[str, float]] | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int]  # extension


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
