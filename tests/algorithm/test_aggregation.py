import math

import pytest
import torch

from trivium.algorithm import AGGREGATIONS, LossScale, UnknownPartError, aggregate, loss_scale, sequence_sums

# docs/algorithms.md §1 worked example: λ_1 = [1, 3] (n = 2), λ_2 = [2, 2, 2, 5] (n = 4), C = 4; Σλ = 15.
LAMBDAS = [[1.0, 3.0], [2.0, 2.0, 2.0, 5.0]]
WORKED = {
    "token-mean": 15 / 6,  # 2.5
    "seq-mean-token-sum": 15 / 2,  # 7.5
    "seq-mean-token-mean": (4 / 2 + 11 / 4) / 2,  # 2.375
    "seq-mean-token-sum-norm": 15 / (2 * 4),  # 1.875
}


def test_worked_numbers_are_the_documented_ones():
    assert [WORKED[m] for m in sorted(WORKED)] == [2.375, 7.5, 1.875, 2.5]


@pytest.mark.parametrize("mode", sorted(WORKED))
@pytest.mark.parametrize("pack_length", [None, 64], ids=["padded", "packed"])
def test_worked_example(make_batch, place_values, mode, pack_length):
    batch = make_batch([2, 4], pack_length=pack_length)
    assert batch.num_rows == (2 if pack_length is None else 1)  # packed: both sequences share one row
    values = place_values(batch, LAMBDAS, fill=1e6)  # prompt and padding hold junk that must not count
    scale = loss_scale(batch.loss_mask, batch.seq_index, norm_constant=4)
    assert scale == LossScale(num_tokens=6, num_seqs=2, norm_constant=4)
    out = aggregate(values, batch.loss_mask, batch.seq_index, mode, scale)
    assert out.dim() == 0
    assert out.item() == pytest.approx(WORKED[mode], rel=1e-6)


@pytest.mark.parametrize("mode", sorted(WORKED))
def test_tool_tokens_inside_a_response_do_not_count(make_batch, place_values, mode):
    # Sequence 0 gets a tool token between its two action tokens: n_0 stays 2, the numbers stay the same.
    batch = make_batch([[True, False, True], 4], pack_length=64)
    values = place_values(batch, LAMBDAS)
    values[(batch.seq_index == 0) & ~batch.loss_mask] = float("nan")  # prompt and the tool token
    scale = loss_scale(batch.loss_mask, batch.seq_index, norm_constant=4)
    out = aggregate(values, batch.loss_mask, batch.seq_index, mode, scale)
    assert out.item() == pytest.approx(WORKED[mode], rel=1e-6)


def test_sequences_without_action_tokens_are_not_counted_in_num_seqs(make_batch):
    batch = make_batch([2, [False, False], 4])
    scale = loss_scale(batch.loss_mask, batch.seq_index, norm_constant=8)
    assert (scale.num_tokens, scale.num_seqs) == (6, 2)


def test_sequence_sums_follow_seq_index_not_rows(make_batch, place_values):
    batch = make_batch([2, 4, 1], pack_length=64)
    values = place_values(batch, [*LAMBDAS, [7.0]])
    sums = sequence_sums(values, batch.loss_mask, batch.seq_index)
    assert sums.tolist() == [4.0, 11.0, 7.0]


def test_empty_mask_gives_zero_not_nan(make_batch):
    batch = make_batch([[False, False]])
    scale = loss_scale(batch.loss_mask, batch.seq_index, norm_constant=4)
    for mode in AGGREGATIONS.names():
        out = aggregate(torch.ones(batch.loss_mask.shape), batch.loss_mask, batch.seq_index, mode, scale)
        assert out.item() == 0.0 and not math.isnan(out.item())


def test_bad_inputs_are_named(make_batch):
    batch = make_batch([2])
    scale = loss_scale(batch.loss_mask, batch.seq_index, norm_constant=4)
    with pytest.raises(UnknownPartError, match="token-mean") as err:
        aggregate(torch.ones(batch.loss_mask.shape), batch.loss_mask, batch.seq_index, "token_mean", scale)
    assert "did you mean 'token-mean'" in str(err.value)
    with pytest.raises(ValueError, match=r"\[R, L\] shape"):
        aggregate(torch.ones(3), batch.loss_mask, batch.seq_index, "token-mean", scale)
    with pytest.raises(ValueError, match="bool"):
        loss_scale(batch.loss_mask.float(), batch.seq_index, norm_constant=4)
    with pytest.raises(ValueError, match="norm_constant must be > 0"):
        loss_scale(batch.loss_mask, batch.seq_index, norm_constant=0)
