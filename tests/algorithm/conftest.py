"""Layouts for algorithm tests, built with the real ``collate`` so that tests see the trainer's layout."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from trivium.types import Experience, TrainBatch, collate

PROMPT_LENGTH = 2


def build_batch(
    responses: Sequence[int | Sequence[bool]],
    *,
    pack_length: int | None = None,
    rewards: Sequence[float] | None = None,
    group_ids: Sequence[int] | None = None,
) -> TrainBatch:
    """One sequence per entry: an int n is n action tokens; a list of bools is the action mask itself
    (False = a tool token inside the response). Every sequence has a 2-token prompt."""
    experiences = []
    for i, resp in enumerate(responses):
        action = torch.ones(resp, dtype=torch.bool) if isinstance(resp, int) else torch.tensor(resp)
        n = PROMPT_LENGTH + action.numel()
        experiences.append(
            Experience(
                tokens=torch.arange(n) + 3,
                prompt_length=PROMPT_LENGTH,
                action_mask=action,
                logprobs=torch.zeros(action.numel()),
                reward=0.0 if rewards is None else float(rewards[i]),
                group_id=0 if group_ids is None else group_ids[i],
            )
        )
    return collate(experiences, pad_token_id=0, pack_length=pack_length)


def place(batch: TrainBatch, per_seq: Sequence[Sequence[float]], fill: float = 0.0) -> torch.Tensor:
    """Per-token values ``[R, L]``: sequence i's list goes, in order, onto its action tokens."""
    out = torch.full(batch.loss_mask.shape, fill)
    for i, values in enumerate(per_seq):
        where = (batch.seq_index == i) & batch.loss_mask
        assert int(where.sum()) == len(values), f"sequence {i} has {int(where.sum())} action tokens"
        out[where] = torch.tensor(values, dtype=out.dtype)
    return out


@pytest.fixture
def make_batch():
    return build_batch


@pytest.fixture
def place_values():
    return place
