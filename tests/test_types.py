"""Experience validation and collation into padded and packed TrainBatches."""

import pytest
import torch

from trivium.types import Experience, collate

PAD = 0


def exp(prompt, response, mask=None, lp=None, reward=0.0, group=0):
    n = len(response)
    return Experience(
        tokens=torch.tensor(prompt + response),
        prompt_length=len(prompt),
        action_mask=torch.tensor(mask if mask is not None else [True] * n),
        logprobs=torch.tensor(lp if lp is not None else [-0.5] * n),
        reward=reward,
        group_id=group,
    )


def test_experience_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"action_mask must have shape"):
        Experience(
            tokens=torch.tensor([1, 2, 3]),
            prompt_length=1,
            action_mask=torch.ones(3, dtype=torch.bool),
            logprobs=torch.zeros(2),
        )
    with pytest.raises(ValueError, match="prompt_length"):
        Experience(
            tokens=torch.tensor([1, 2]),
            prompt_length=0,
            action_mask=torch.ones(2, dtype=torch.bool),
            logprobs=torch.zeros(2),
        )


def test_padded_collation_masks_and_alignment():
    a = exp([5, 6], [7, 8, 9], mask=[True, False, True], lp=[-1.0, -9.0, -3.0], reward=1.0, group=3)
    b = exp([5], [4], reward=0.0, group=4)
    batch = collate([a, b], pad_token_id=PAD)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, PAD, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # target-aligned: the entry at t is about input_ids[t]; prompt and masked tool tokens are not trained
    assert batch.loss_mask.tolist() == [[False, False, True, False, True], [False, True, False, False, False]]
    assert batch.rollout_logprobs[0].tolist() == [0.0, 0.0, -1.0, 0.0, -3.0]
    assert batch.seq_index.tolist() == [[0, 0, 0, 0, 0], [1, 1, -1, -1, -1]]
    assert batch.position_ids[1, :2].tolist() == [0, 1]
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.group_ids.tolist() == [3, 4]
    assert batch.response_lengths.tolist() == [2, 1]


def test_packed_collation_restarts_positions():
    seqs = [exp([1, 2], [3, 4]), exp([1], [2]), exp([1, 2, 3], [4, 5, 6]), exp([1], [5, 6])]
    batch = collate(seqs, pad_token_id=PAD, pack_length=6)
    assert batch.packed and batch.attention_mask is None
    assert batch.num_seqs == 4 and batch.num_rows < 4
    for r in range(batch.num_rows):  # every sequence's positions start at 0 and count up
        for s in batch.seq_index[r].unique().tolist():
            if s >= 0:
                pos = batch.position_ids[r][batch.seq_index[r] == s]
                assert pos.tolist() == list(range(len(pos)))
                assert len(pos) == seqs[s].tokens.numel()
    assert int(batch.loss_mask.sum()) == sum(e.num_action_tokens for e in seqs)


def test_select_rows_renumbers_sequences():
    seqs = [exp([1], [2], reward=float(i), group=i) for i in range(4)]
    batch = collate(seqs, pad_token_id=PAD)
    sub = batch.select_rows([3, 1])
    assert sub.rewards.tolist() == [1.0, 3.0]  # sorted by original sequence id
    assert sub.seq_index[:, 0].tolist() == [1, 0]
    assert sub.seq_to_tokens(sub.rewards)[:, 0].tolist() == [3.0, 1.0]
