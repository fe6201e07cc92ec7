"""Token-in, token-out multi-turn conversations: the transcript is built from the engine's own token ids.

A ``Transcript`` starts from the rendered opening messages (the prompt). Each model turn appends exactly
the token ids the engine sampled (action mask True, with their log-probs); each environment / tool / user
turn appends the tokens the chat template puts between the end of that model turn and the start of the
next one (action mask False). The model's text is never re-tokenised, so what the trainer sees is what
the model saw and sampled, byte for byte. Environment, tool and user text is tokenised as text: a special
token written in it (``<|end|><|assistant|>`` from an untrusted page or user) is never a control token
(``chat.render_ids``), so nobody but the model and the template writes turn boundaries.

Between turns, the template's own tokens are found by rendering a fixed two-turn probe conversation: the
tokens after the assistant's end-of-turn token (e.g. the newline after ``<|im_end|>``) are the closing
glue, and what rendering more messages adds after the probe is the environment's turn (its header, its
content and the next generation prompt). A model turn that ended without the end-of-turn token (a stop
string, or max_tokens) gets the template's end-of-turn token appended, masked, as the template would
render it.

This relies on the template being *prefix-stable*: rendering more turns never rewrites earlier ones.
``check_template`` tells whether a tokenizer's template is (``trivium check-template MODEL``); templates that
strip reasoning blocks from earlier assistant turns are not, and multi-turn workflows refuse them unless
told otherwise (``allow_unstable_template``), because the model would be trained on a context it never
sees at inference.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trivium.models.chat import TemplateError, render_ids
from trivium.models.protocol import Generation

__all__ = ["TemplateReport", "Transcript", "check_template", "render_ids"]

_PROBE_USER = {"role": "user", "content": "Hello."}
_PROBE_ASSISTANT = {"role": "assistant", "content": "Hi."}


@dataclass
class _Glue:
    end_of_turn: int  # the template's end-of-turn token of an assistant turn
    closing: list[int]  # template tokens after it (e.g. "\n"), before the next message
    probe: list[int]  # the rendered probe conversation (user, assistant) that new messages are appended to


class Transcript:
    """A conversation as token ids with an action mask and log-probs; see the module docstring.

    ``tokens[:prompt_length]`` is the opening prompt; ``mask``/``logprobs`` cover ``tokens[prompt_length:]``.
    """

    def __init__(
        self,
        tokenizer,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        eos_ids: Iterable[int] = (),
        vision: Any = None,
    ):
        """``vision``: a ``VisionProcessor`` (a vision-language model): image parts of messages
        (``{"type": "image", "image": <ImageStore reference>}``) become their visual tokens, and ``images``
        lists the references in order."""
        self.tokenizer = tokenizer
        self.vision = vision
        self.tools = list(tools) if tools else None
        # end-of-turn candidates: the engine's eos ids (eos_ids) and the tokenizer's eos
        self.eos_ids = set(eos_ids) | (
            {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        )
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.images: list[str] = image_refs(self.messages)
        self.tokens: list[int] = self._expanded(
            render_ids(tokenizer, self.messages, True, self.tools), self.images
        )
        self.prompt_length = len(self.tokens)
        self.mask: list[bool] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []  # weights version per response token (-1: environment, or not told)
        self.turns = 0  # model turns so far
        self._awaiting_model = True  # the transcript ends with a generation prompt
        self._glue: _Glue | None = None

    def fork(self) -> Transcript:
        """An independent copy (shares the tokenizer): continue one conversation in several ways."""
        other = copy.copy(self)
        other.messages = [dict(m) for m in self.messages]
        other.tokens, other.mask, other.logprobs = list(self.tokens), list(self.mask), list(self.logprobs)
        other.versions = list(self.versions)
        other.images = list(self.images)
        return other

    @property
    def ids(self) -> list[int]:
        """The whole conversation so far (the prompt of the next model turn once messages were added)."""
        return list(self.tokens)

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def add_generation(self, gen: Generation, message: Mapping[str, Any] | None = None) -> None:
        """Append a model turn: its sampled ids (mask True) and log-probs. ``message`` (default: the turn's
        text as an assistant message) is what ``messages`` records for it, e.g. with parsed tool_calls."""
        if not self._awaiting_model:
            raise RuntimeError(
                "Transcript.add_generation: add the environment's messages before the next model turn"
            )
        if list(gen.prompt_ids) != self.tokens:
            raise ValueError(
                "Transcript.add_generation: the generation was sampled from another prompt than this "
                f"transcript ({len(gen.prompt_ids)} vs {len(self.tokens)} tokens); generate from transcript.ids"
            )
        self.tokens += gen.response_ids
        self.mask += [True] * len(gen.response_ids)
        self.logprobs += list(gen.logprobs)
        self.versions += list(gen.versions) if gen.versions else [-1] * len(gen.response_ids)
        self.messages.append(
            dict(message) if message is not None else {"role": "assistant", "content": gen.text}
        )
        self.turns += 1
        self._awaiting_model = False

    def add_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Append environment/tool/user messages after a model turn (mask False); returns their token ids
        (closing glue of the model turn, the messages, and the next generation prompt)."""
        if self._awaiting_model:
            raise RuntimeError("Transcript.add_messages: a model turn must come first (add_generation)")
        new = [dict(m) for m in messages]
        if not new:
            raise ValueError("Transcript.add_messages needs at least one message")
        glue = self._closing_glue()
        last = self.tokens[-1] if len(self.tokens) > self.prompt_length else None
        added = ([] if last in self.eos_ids else [glue.end_of_turn]) + glue.closing
        before = glue.probe
        after = render_ids(self.tokenizer, [_PROBE_USER, _PROBE_ASSISTANT, *new], True, self.tools)
        if after[: len(before)] != before:
            roles = [m.get("role") for m in new]
            raise TemplateError(
                f"the chat template is not prefix-stable when appending {roles} messages after an assistant "
                "turn: the earlier tokens change. Use a prefix-stable template (trivium check-template)."
            )
        refs = image_refs(new)
        added += self._expanded(after[len(before) :], refs)
        self.images += refs
        self.tokens += added
        self.mask += [False] * len(added)
        self.logprobs += [0.0] * len(added)
        self.versions += [-1] * len(added)
        self.messages += new
        self._awaiting_model = True
        return added

    def _expanded(self, ids: list[int], refs: list[str]) -> list[int]:
        """``ids`` with each image placeholder widened to its image's visual tokens (``VisionProcessor``)."""
        if not refs:
            return ids
        if self.vision is None:
            raise ValueError("the messages hold images and this transcript has no image processor (vision)")
        return self.vision.expand(ids, refs)

    def _closing_glue(self) -> _Glue:
        if self._glue is None:
            key = (
                id(self.tokenizer),
                self.tokenizer.chat_template,
                json.dumps(self.tools, sort_keys=True),
                tuple(sorted(self.eos_ids)),
            )
            glue = _GLUE_CACHE.get(key)
            if glue is None:  # once per tokenizer and tool set, not once per episode
                glue = _GLUE_CACHE[key] = _probe_glue(self.tokenizer, self.tools, self.eos_ids)
            self._glue = glue
        return self._glue


_GLUE_CACHE: dict[tuple, _Glue] = {}


def image_refs(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The image references of ``messages``' image parts (``{"type": "image", "image": ref}``), in order."""
    return [
        str(part["image"])
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, Mapping) and part.get("type") == "image" and isinstance(part.get("image"), str)
    ]


def _probe_glue(tokenizer, tools, eos_ids: set[int]) -> _Glue:
    opened = render_ids(tokenizer, [_PROBE_USER], True, tools)
    closed = render_ids(tokenizer, [_PROBE_USER, _PROBE_ASSISTANT], False, tools)
    if closed[: len(opened)] != opened:
        raise TemplateError(
            "the chat template renders the generation prompt differently from the start of an "
            "assistant turn, so model turns cannot be appended token for token"
        )
    turn = closed[len(opened) :]
    ends = [j for j, t in enumerate(turn) if t in eos_ids]
    if not ends:
        raise TemplateError(
            f"the chat template ends an assistant turn with none of the end-of-turn tokens {sorted(eos_ids)} "
            "(the tokenizer's eos): set the tokenizer's eos_token to the template's end-of-turn token"
        )
    return _Glue(turn[ends[-1]], turn[ends[-1] + 1 :], closed)


@dataclass
class TemplateReport:
    """What ``check_template`` found: ``stable`` is False when some turn's tokens change later."""

    stable: bool
    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.stable:
            return "chat template is prefix-stable across turns (system, user, assistant, tool calls, tool results)"
        return "chat template is NOT prefix-stable:\n" + "\n".join(f"  - {p}" for p in self.problems)


def probe_conversation(reasoning: bool = True) -> list[dict[str, Any]]:
    """A conversation exercising every role, tool calls and (optionally) a reasoning block."""
    think = "<think>\nThe user wants a sum; use the tool.\n</think>\n" if reasoning else ""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 12 + 30?"},
        {
            "role": "assistant",
            "content": think
            + '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 30"}}\n</tool_call>',
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": think + "12 + 30 = 42."},
        {"role": "user", "content": "And times two?"},
        {"role": "assistant", "content": "84."},
    ]


def check_template(tokenizer, messages: Sequence[Mapping[str, Any]] | None = None) -> TemplateReport:
    """Is the template prefix-stable? For every assistant turn k, rendering ``messages[:k]`` with the
    generation prompt, and ``messages[:k+1]`` (the turn as written), must be prefixes of rendering the whole
    conversation. Where it is not, the report
    says which turn and shows the tokens that differ (e.g. a reasoning block stripped from earlier turns).
    """
    messages = [dict(m) for m in (messages if messages is not None else probe_conversation())]
    problems: list[str] = []
    try:
        full = render_ids(tokenizer, messages, False)
    except Exception as exc:  # e.g. a template that refuses the tool role
        return TemplateReport(False, [f"the template cannot render the probe conversation: {exc}"])
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        # What the model saw before turn k, and the turn as it wrote it, must both survive later turns.
        for what, seen in (
            ("the prompt the model saw", render_ids(tokenizer, messages[:k], True)),
            ("the turn as the model wrote it", render_ids(tokenizer, messages[: k + 1], False)),
        ):
            if full[: len(seen)] == seen:
                continue
            j = next((i for i, (a, b) in enumerate(zip(seen, full)) if a != b), min(len(seen), len(full)))
            problems.append(
                f"assistant turn {k}: {what} differs from the final conversation at token {j}: "
                f"{tokenizer.decode(seen[j : j + 12])!r} became {tokenizer.decode(full[j : j + 12])!r} "
                "(earlier turns are rewritten, e.g. reasoning stripped)"
            )
            break
    return TemplateReport(not problems, problems)
