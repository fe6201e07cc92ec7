"""SamplingParams validation, the top-k/top-p filter and the stop rules, against direct definitions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trivium.models.loading import load_tokenizer
from trivium.models.protocol import Generation, SamplingParams
from trivium.models.sampling import DRAW_BLOCK, draw, filter_top_k_top_p, sample_next
from trivium.models.stopping import StopChecker


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("max_tokens", 0),
        ("stop", ("",)),
        ("stop_token_ids", (-1,)),
    ],
)
def test_invalid_sampling_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field}="):
        SamplingParams(**{field: value})


def test_sampling_params_are_hashable_with_list_inputs() -> None:
    a = SamplingParams(stop=["</a>"], stop_token_ids=[3])  # type: ignore[arg-type]
    assert a == SamplingParams(stop=("</a>",), stop_token_ids=(3,))
    assert len({a, SamplingParams(stop=("</a>",), stop_token_ids=(3,))}) == 1
    assert SamplingParams(temperature=0).greedy


def test_generation_checks_alignment() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        Generation(prompt_ids=(1,), response_ids=(2, 3), logprobs=(0.0,), finish_reason="length", text="")


def test_filter_matches_definition() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    probs = logits.softmax(-1)[0]  # 0.55, 0.20, 0.12, 0.07, 0.03 (rounded)
    keep = lambda out: torch.isfinite(out[0]).tolist()  # noqa: E731
    assert keep(filter_top_k_top_p(logits, 2, 1.0)) == [True, True, False, False, False]
    # top-p keeps the most likely tokens until their mass reaches p
    p = float(probs[0] + probs[1]) - 1e-4
    assert keep(filter_top_k_top_p(logits, 0, p)) == [True, True, False, False, False]
    assert keep(filter_top_k_top_p(logits, 0, float(probs[0]) + 1e-4)) == [True, True, False, False, False]
    assert keep(filter_top_k_top_p(logits, 0, 0.01)) == [True, False, False, False, False]
    # top-k first, then top-p on the renormalised remainder
    assert keep(filter_top_k_top_p(logits, 3, 0.7)) == [True, True, False, False, False]


def test_sample_next_reports_unfiltered_logprobs() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
    tokens, logprobs = sample_next(logits, params, g)
    reference = torch.log_softmax(logits / 0.7, -1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.equal(logprobs, reference)
    assert (tokens[:, None] == logits.topk(5, dim=-1).indices).any(-1).all()  # only top-5 tokens drawn
    greedy, greedy_lp = sample_next(logits, SamplingParams(temperature=0), g)
    assert torch.equal(greedy, logits.argmax(-1))
    assert torch.allclose(greedy_lp, logits.log_softmax(-1).max(-1).values)


@pytest.mark.parametrize("vocab", [DRAW_BLOCK * 3 + 17, 151_936])
def test_the_two_level_draw_has_the_rows_distribution(vocab: int) -> None:
    """Mass in the first block, the middle, across a block edge and in the last (partial) block, zeros
    between: 50k draws land on each token at its probability (5 sigma), never on a zero."""
    places = [0, 5, DRAW_BLOCK - 1, DRAW_BLOCK, 2 * DRAW_BLOCK + 9, vocab - 1]
    weights = torch.tensor([0.1, 0.25, 0.05, 0.3, 0.2, 0.1])
    chunk, chunks = 250, 200
    probs = torch.zeros(chunk, vocab)
    probs[:, places] = weights * 3.0  # rows need not sum to 1
    g = torch.Generator().manual_seed(0)
    tokens = torch.cat([draw(probs, g) for _ in range(chunks)])
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert counts[places].sum() == chunk * chunks  # nothing outside the support
    sigma = (weights * (1 - weights) / (chunk * chunks)).sqrt()
    assert ((counts[places] / (chunk * chunks) - weights).abs() <= 5 * sigma).all(), counts[places]


def test_the_draw_is_reproducible_and_follows_softmax_rows_at_a_large_vocabulary() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 151_936, generator=g) * 4
    probs = logits.softmax(-1)
    a = draw(probs, torch.Generator().manual_seed(7))
    assert torch.equal(a, draw(probs, torch.Generator().manual_seed(7)))
    row = probs[:1].repeat(250, 1)  # one row drawn 50k times: its top tokens' frequencies
    many = torch.cat([draw(row, g) for _ in range(200)])
    top = probs[0].topk(3)
    freq = torch.bincount(many, minlength=probs.size(1))[top.indices].double() / many.numel()
    sigma = (top.values * (1 - top.values) / many.numel()).sqrt()
    assert ((freq - top.values).abs() <= 5 * sigma).all(), (freq, top.values)


def test_stop_checker_precedence_and_text(tiny_dir: Path) -> None:
    tok = load_tokenizer(tiny_dir)
    ids = tok("Tom has 12 pens. #### 7")["input_ids"]
    params = SamplingParams(stop=("####",), stop_token_ids=(ids[0],))
    stopper = StopChecker(params, {tok.eos_token_id}, tok)
    assert stopper.finish_reason([ids[1], tok.eos_token_id], 10) == "eos"
    assert stopper.finish_reason([ids[1], ids[0]], 10) == "stop"
    first = next(k for k in range(1, len(ids) + 1) if "####" in tok.decode(ids[1:k]))
    reasons = [stopper.finish_reason(ids[1:k], 100) for k in range(2, first + 1)]
    assert reasons == [None] * (len(reasons) - 1) + ["stop"]
    assert stopper.finish_reason(ids[1:3], 2) == "length"
    assert stopper.final_text("a #### 7") == "a ####"
    cut = StopChecker(SamplingParams(stop=("####",), include_stop_str_in_output=False), [1], tok)
    assert cut.final_text("a #### 7") == "a "
