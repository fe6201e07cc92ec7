"""Chat conversations to token ids with an assistant mask, by the tokenizer's own template.

A conversation is rendered turn by turn: the tokens of assistant turn k are what rendering messages[:k+1]
adds after rendering messages[:k] with the generation prompt. That only works when the template is
prefix-stable (rendering more turns never rewrites earlier ones); where it is not (e.g. templates that
strip reasoning from earlier turns), the mask would be wrong, so ``encode_conversation`` refuses with an
error naming the turn instead of training on misaligned tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class TemplateError(ValueError):
    pass


def render_ids(
    tokenizer,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template (no extra special tokens)."""
    kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


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
