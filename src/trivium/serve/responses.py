"""Engine generations to OpenAI response bodies, and responses to server-sent-event chunks.

Design decisions:
- Tool calls: when the request lists tools (and ``tool_choice`` is not ``"none"``), the reply's text is
  parsed with ``parse_tool_calls``. Parsed calls become ``message.tool_calls`` with ``finish_reason:
  "tool_calls"`` and ``content`` is the text outside the blocks (null when there is none). A malformed
  block is not dropped: the whole text stays ``content``, no call is returned, and the parse errors are
  listed in the choice's ``tool_call_errors`` extension, so the agent can tell the model what went wrong.
- Finish reasons: the engine's ``eos`` and ``stop`` are OpenAI's ``stop``; ``length`` stays ``length``.
- Token strings in log-probs are each token decoded on its own (a token holding part of a UTF-8
  character decodes to U+FFFD, as in vLLM); ``bytes`` are the token's exact bytes when the tokenizer is
  byte-level (GPT-2 style, e.g. Qwen, Llama 3), otherwise the UTF-8 of that string.
- Streaming replays a finished generation: the server generates first (so a streamed call is recorded
  exactly like a plain one) and then sends one chunk per sampled token, whose ``content`` pieces
  concatenate to the non-streamed text exactly and whose ``token_ids`` concatenate to the sampled ids. A
  reply with tool calls is sent as one chunk (its content is not contiguous text). Agents get the
  protocol they expect, not lower latency; time to first token is the whole generation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trivium.models.protocol import FinishReason, Generation
from trivium.serve.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    TokenLogprob,
    ToolCallOut,
)
from trivium.tools.calls import parse_tool_calls

__all__ = ["ChatTurn", "chat_choice", "chat_stream", "completion_choice", "completion_stream", "text_pieces"]


def openai_finish(reason: FinishReason) -> str:
    return "length" if reason == "length" else "stop"


@dataclass(frozen=True)
class ChatTurn:
    """One chat choice: the response body's choice and the assistant message in template form.

    ``message`` is what the agent is expected to send back (normalised like ``ChatMessage.template``),
    which is how the recorder recognises a continuation.
    """

    choice: ChatChoice
    message: dict[str, Any]


def chat_choice(
    gen: Generation, index: int, tokenizer, *, parse_tools: bool, logprobs: bool, call_prefix: str
) -> ChatTurn:
    """The chat choice for ``gen`` (see the module docstring for tool calls); tool-call ids are
    ``{call_prefix}_{index}_{k}``, unique within the response."""
    content, calls, errors = gen.text, (), None
    if parse_tools:
        parsed = parse_tool_calls(gen.text, id_prefix=f"{call_prefix}_{index}")
        if parsed.errors:
            errors = list(parsed.errors)
        elif parsed.calls:
            content, calls = parsed.content, parsed.calls
    message = AssistantMessage(
        content=content if content or not calls else None,
        tool_calls=[ToolCallOut(**c.openai()) for c in calls] or None,
    )
    choice = ChatChoice(
        index=index,
        message=message,
        finish_reason="tool_calls" if calls else openai_finish(gen.finish_reason),
        logprobs=ChoiceLogprobs(content=token_logprobs(tokenizer, gen)) if logprobs else None,
        token_ids=list(gen.response_ids),
        tool_call_errors=errors,
    )
    template: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        template["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in calls
        ]
    return ChatTurn(choice, template)


def completion_choice(gen: Generation, index: int, tokenizer, *, logprobs: bool) -> CompletionChoice:
    lp = None
    if logprobs:
        pieces = text_pieces(tokenizer, gen.response_ids, gen.text)
        lp = CompletionLogprobs(
            tokens=[t.token for t in token_logprobs(tokenizer, gen)],
            token_logprobs=list(gen.logprobs),
            text_offset=_offsets(pieces),
        )
    return CompletionChoice(
        index=index,
        text=gen.text,
        finish_reason=openai_finish(gen.finish_reason),
        logprobs=lp,
        token_ids=list(gen.response_ids),
    )


# ------------------------------------------------------------------------------------------ tokens
def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character standing for each byte -> that byte."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(visible), 0
    for b in range(256):
        if b not in visible:
            visible.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(visible, chars)}


_BYTE_DECODER = _bytes_to_unicode()


def _is_byte_level(tokenizer) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


def token_logprobs(tokenizer, gen: Generation) -> list[TokenLogprob]:
    """OpenAI ``logprobs.content`` entries of the sampled tokens (no top alternatives)."""
    ids = list(gen.response_ids)
    strings = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    raw = tokenizer.convert_ids_to_tokens(ids) if _is_byte_level(tokenizer) else [None] * len(ids)
    out = []
    for text, piece, lp in zip(strings, raw, gen.logprobs):
        if piece is not None and all(ch in _BYTE_DECODER for ch in piece):
            data = bytes(_BYTE_DECODER[ch] for ch in piece)
        else:
            data = text.encode("utf-8")
        out.append(TokenLogprob(token=text, bytes=list(data), logprob=lp))
    return out


def text_pieces(tokenizer, ids: Sequence[int], text: str) -> list[str]:
    """One piece of ``text`` per token, concatenating to ``text`` exactly.

    Piece k is what decoding ``ids[:k+1]`` adds to ``text`` (held back while a UTF-8 character is
    incomplete; empty for tokens that add nothing, such as eos); whatever the decoded prefixes never
    reached (e.g. text cut at a stop string) is settled on the last token. Decodes every prefix:
    O(len(ids)^2) characters, negligible next to generating them.
    """
    pieces: list[str] = []
    emitted = 0
    for k in range(1, len(ids) + 1):
        partial = tokenizer.decode(list(ids[:k]), skip_special_tokens=True).rstrip("\ufffd")
        upto = max(emitted, _common_length(partial, text))
        pieces.append(text[emitted:upto])
        emitted = upto
    if pieces:
        pieces[-1] += text[emitted:]
    return pieces


def _common_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _offsets(pieces: list[str]) -> list[int]:
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return offsets


# ------------------------------------------------------------------------------------------ streaming
def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


def chat_stream(response: ChatCompletionResponse, tokenizer, include_usage: bool) -> Iterator[str]:
    """The SSE events of ``response``, ending with ``data: [DONE]`` (see the module docstring)."""
    head = {
        "id": response.id,
        "object": "chat.completion.chunk",
        "created": response.created,
        "model": response.model,
    }
    first = {"prompt_token_ids": response.prompt_token_ids, "model_version": response.model_version}

    def chunk(
        index: int,
        delta: dict,
        token_ids: list[int],
        logprobs: Any = None,
        finish: str | None = None,
        **extra,
    ):
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
            "token_ids": token_ids,
            **extra,
        }
        return sse({**head, **first, "choices": [choice]} if first else {**head, "choices": [choice]})

    for c in response.choices:
        yield chunk(c.index, {"role": "assistant", "content": ""}, [])
        first = {}
        lps = c.logprobs.content if c.logprobs else None
        if c.message.tool_calls:
            calls = [{"index": k, **t.model_dump()} for k, t in enumerate(c.message.tool_calls)]
            logprobs = {"content": [t.model_dump() for t in lps]} if lps else None
            yield chunk(c.index, {"content": c.message.content, "tool_calls": calls}, c.token_ids, logprobs)
        else:
            pieces = text_pieces(tokenizer, c.token_ids, c.message.content or "")
            for k, (token, piece) in enumerate(zip(c.token_ids, pieces)):
                logprobs = {"content": [lps[k].model_dump()]} if lps else None
                yield chunk(c.index, {"content": piece}, [token], logprobs)
        errors = {"tool_call_errors": c.tool_call_errors} if c.tool_call_errors else {}
        yield chunk(c.index, {}, [], finish=c.finish_reason, **errors)
    if include_usage:
        yield sse({**head, "choices": [], "usage": response.usage.model_dump()})
    yield sse("[DONE]")


def completion_stream(response: CompletionResponse, tokenizer, include_usage: bool) -> Iterator[str]:
    """The SSE events of a completion: one chunk per sampled token, then one with the finish reason."""
    head = {
        "id": response.id,
        "object": "text_completion",
        "created": response.created,
        "model": response.model,
    }
    first = {"prompt_token_ids": response.prompt_token_ids, "model_version": response.model_version}
    for c in response.choices:
        pieces = text_pieces(tokenizer, c.token_ids, c.text)
        for k, (token, piece) in enumerate(zip(c.token_ids, pieces)):
            lp = c.logprobs
            logprobs = (
                {
                    "tokens": [lp.tokens[k]],
                    "token_logprobs": [lp.token_logprobs[k]],
                    "text_offset": [lp.text_offset[k]],
                }
                if lp
                else None
            )
            choice = {
                "index": c.index,
                "text": piece,
                "logprobs": logprobs,
                "finish_reason": None,
                "token_ids": [token],
            }
            yield sse({**head, **first, "choices": [choice]})
            first = {}
        done = {
            "index": c.index,
            "text": "",
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "token_ids": [],
        }
        yield sse({**head, "choices": [done]})
    if include_usage:
        yield sse({**head, "choices": [], "usage": response.usage.model_dump()})
    yield sse("[DONE]")
