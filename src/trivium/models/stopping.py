"""When a response is finished, and how its text ends.

Design decisions:
- Token ids are never cut: a response keeps every sampled token up to and including the one that finished
  it (eos, a stop token id, or the token that completed a stop string), because the trainer must see
  exactly the sampled sequence. Only ``text`` honours ``include_stop_str_in_output``.
- Stop strings are searched in the decoded *tail* of the response (enough tokens to hold the longest stop
  string), so the check costs O(1) per token instead of re-decoding the whole response. A stop string seen
  in the tail is new: any earlier occurrence would already have finished the row.
- Precedence when one token does several things: eos, then stop token id, then stop string, then length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from trivium.models.protocol import FinishReason, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["StopChecker"]


class StopChecker:
    """Decides, after each sampled token, whether a response is finished."""

    def __init__(self, params: SamplingParams, eos_ids: Iterable[int], tokenizer: PreTrainedTokenizerBase):
        self.eos_ids = frozenset(eos_ids)
        self.stop_ids = frozenset(params.stop_token_ids)
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.tokenizer = tokenizer
        # Every byte-level token carries at least one byte, so this many tokens hold any stop string; the
        # margin covers tokens that decode to nothing (skipped specials) or to a partial character.
        self.tail = max((len(s.encode()) for s in self.stop), default=0) + 4

    def finish_reason(self, response: Sequence[int], budget: int) -> FinishReason | None:
        """Why ``response`` (whose last token was just sampled) is finished, or None if it goes on."""
        last = response[-1]
        if last in self.eos_ids:
            return "eos"
        if last in self.stop_ids:
            return "stop"
        if self.stop:
            tail = self.tokenizer.decode(response[-self.tail :], skip_special_tokens=True)
            if any(s in tail for s in self.stop):
                return "stop"
        if len(response) >= budget:
            return "length"
        return None

    def final_text(self, text: str) -> str:
        """``text`` cut right after (or, without ``include_stop_str_in_output``, before) its first stop string.

        The token that completed a stop string may carry characters past it; they are dropped from the text.
        """
        hits = [(i, s) for s in self.stop if (i := text.find(s)) >= 0]
        if not hits:
            return text
        start, s = min(hits)
        return text[: start + len(s)] if self.include_stop else text[:start]
