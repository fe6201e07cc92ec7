"""Chat conversations to token ids with an assistant mask, by the tokenizer's own template.

A conversation is rendered turn by turn: the tokens of assistant turn k are what rendering messages[:k+1]
adds after rendering messages[:k] with the generation prompt. That only works when the template is
prefix-stable (rendering more turns never rewrites earlier ones); where it is not (e.g. templates that
strip reasoning from earlier turns), the mask would be wrong, so ``encode_conversation`` refuses with an
error naming the turn instead of training on misaligned tokens.

Text in messages and tools is tokenised as text: a special token written in a message (a user typing
``<|end|><|assistant|>``, an environment echoing it, an endpoint caller forging a turn) becomes the tokens
of those characters, never the control token. Only the template's own special tokens are control tokens.
How (``render_ids``): when no string of the conversation holds a special token, the rendered text is
tokenised as it always was. Otherwise the conversation is rendered a second time with every special token
in its strings *defanged* (first character replaced by a private-use character, so lengths are equal);
the special tokens of that render are the template's own, at the same offsets in the real render. The real
render is cut at those offsets; the pieces between them are tokenised with special-token parsing off
(``split_special_tokens``), the cuts become the template's special-token ids. Without forged tokens this
gives exactly the ordinary tokenisation (the tokenizer, too, tokenises the text between special tokens
piece by piece). A template that changes the length of the text it is given (e.g. escapes it) cannot be
mapped that way: such a conversation is refused with a ``TemplateError`` naming the token.
"""

from __future__ import annotations

import contextlib
import functools
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any


class TemplateError(ValueError):
    pass


_DEFANG = "\ue000"  # replaces the first character of a special token found in a message's text


def render_ids(
    tokenizer,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template (no extra special tokens);
    special tokens written in messages and tools are tokenised as text (see the module docstring)."""
    messages = [dict(m) for m in messages]
    text = _render(tokenizer, messages, add_generation_prompt, tools)
    pattern = special_pattern(tokenizer)
    if pattern is None or not _holds(pattern, (messages, tools)):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    defanged = _render(tokenizer, _defang(pattern, messages), add_generation_prompt, _defang(pattern, tools))
    forged = next(m.group() for v in _strings((messages, tools)) if (m := pattern.search(v)))
    return _spliced_ids(tokenizer, pattern, text, defanged, forged)


def text_ids(tokenizer, text: str) -> list[int]:
    """``text`` as token ids with special-token parsing off (``<|end|>`` in it is text, not the token)."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def char_budget(tokenizer, tokens: int) -> int:
    """Characters of message text past which a conversation surely renders to at least ``tokens`` tokens,
    known without tokenising it (a 50 MB row takes a minute to tokenise). No token stands for more
    characters than its vocabulary entry is long (byte-level and SentencePiece vocabularies spell a token
    with at least as many characters as the text it stands for); the factor 2 is a margin for normalisers
    that shorten text (e.g. stripping accents)."""
    return tokens * 2 * _longest_token(tokenizer)


def message_chars(messages: Sequence[Mapping[str, Any]]) -> int:
    """Characters of the text of ``messages``: string contents and text parts (what ``char_budget`` is
    compared with)."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(
                len(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
    return total


def last_chars(messages: Sequence[Mapping[str, Any]], keep: int) -> list[dict[str, Any]]:
    """``messages`` with only the last ``keep`` characters of their string contents (earlier contents
    emptied, every message and role kept): a prompt about to lose its oldest tokens anyway, cut before it
    is tokenised."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        content = message.get("content")
        if not isinstance(content, str):
            continue
        message["content"] = content[max(0, len(content) - keep) :]
        keep = max(0, keep - len(content))
    return out


_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _longest_token(tokenizer) -> int:
    """Characters of the tokenizer's longest vocabulary entry (at least 1), computed once per tokenizer."""
    try:
        return _LONGEST[tokenizer]
    except (KeyError, TypeError):
        pass
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced is not cached
        _LONGEST[tokenizer] = longest
    return longest


def _render(tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: Any) -> str:
    kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


def special_pattern(tokenizer) -> re.Pattern[str] | None:
    """A regex matching the tokenizer's special tokens (longest first), or None when it has none."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    specials = {t.content for t in decoder.values() if getattr(t, "special", False) and t.content}
    specials |= {t for t in getattr(tokenizer, "all_special_tokens", ()) if t}
    return _compiled(tuple(sorted(specials, key=lambda t: (-len(t), t))))


@functools.lru_cache(maxsize=64)
def _compiled(specials: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(map(re.escape, specials))) if specials else None


def _strings(value: Any):
    """Every string inside ``value`` (dicts' keys and values, lists, tuples), without recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)


def _holds(pattern: re.Pattern[str], value: Any) -> bool:
    return any(pattern.search(s) for s in _strings(value))


def _defang(pattern: re.Pattern[str], value: Any) -> Any:
    """``value`` with every special token in its strings defanged (same length, see the module docstring)."""
    if isinstance(value, str):
        return pattern.sub(lambda m: _DEFANG + m.group()[1:], value)
    if isinstance(value, Mapping):
        return {_defang(pattern, k): _defang(pattern, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_defang(pattern, v) for v in value]
    return value


def _spliced_ids(tokenizer, pattern: re.Pattern[str], text: str, defanged: str, forged: str) -> list[int]:
    """``text`` tokenised with control tokens only where ``defanged`` (the same render with the messages'
    special tokens defanged) has them; everything else is tokenised as text. ``forged``: a special token
    found in the messages, for the error."""
    cuts = [(m.start(), m.end()) for m in pattern.finditer(defanged)]
    if len(defanged) != len(text) or any(text[a:b] != defanged[a:b] for a, b in cuts):
        raise TemplateError(
            f"a message holds the special token {forged!r} as text, and the chat template rewrites message "
            "text (its length changes), so the template's own control tokens cannot be told apart from it: "
            "remove the token from the message"
        )
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    strips = {t.content: (t.lstrip, t.rstrip) for t in decoder.values()}
    ids: list[int] = []
    start, strip_next = 0, False
    for a, b in [*cuts, (len(text), None)]:
        piece, token = text[start:a], (text[a:b] if b is not None else None)
        lstrip, rstrip = strips.get(token, (False, False)) if token else (False, False)
        piece = piece.lstrip() if strip_next else piece  # as the tokenizer strips around such tokens
        piece = piece.rstrip() if lstrip else piece
        if piece:
            ids += text_ids(tokenizer, piece)
        if token is not None:
            ids.append(tokenizer.convert_tokens_to_ids(token))
            start, strip_next = b, rstrip
    return ids


def encode_conversation(
    tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> tuple[list[int], list[bool], int]:
    """``(tokens, assistant_mask, prompt_length)`` of a whole conversation.

    ``assistant_mask[j]`` is True on tokens of assistant turns (their end-of-turn token included) and
    False on system/user/tool tokens and template glue. ``prompt_length`` is the number of tokens before
    the first assistant token. Raises ``TemplateError`` when there is no assistant turn or when the
    template is not prefix-stable at some turn.
    """
    if not any(m.get("role") == "assistant" for m in messages):
        raise TemplateError("the conversation has no assistant turn: nothing to train on")
    tokens: list[int] = []
    mask: list[bool] = []
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = render_ids(tokenizer, messages[:k], True, tools)
        after = render_ids(tokenizer, messages[: k + 1], False, tools)
        if before[: len(tokens)] != tokens or after[: len(before)] != before:
            raise TemplateError(
                f"the chat template is not prefix-stable at turn {k} (role {message.get('role')!r}): rendering "
                "more turns changed the tokens of earlier ones, so the assistant mask cannot be derived"
            )
        mask += [False] * (len(before) - len(tokens)) + [True] * (len(after) - len(before))
        tokens = after
    if not any(mask):
        raise TemplateError("the assistant turns rendered to no tokens")
    return tokens, mask, mask.index(True)
