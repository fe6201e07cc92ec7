"""The decode loop against references: a teacher-forced fp32 forward pass and ``model.generate``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trivium.models.loading import load_causal_lm, load_tokenizer
from trivium.models.protocol import Generation, RolloutModel, SamplingParams
from trivium.models.transformers_engine import TransformersEngine


@pytest.fixture
def engine(tiny_dir: Path) -> TransformersEngine:
    return TransformersEngine.from_pretrained(tiny_dir, device="cpu", dtype="float32", seed=0)


def teacher_forced_logprobs(model: torch.nn.Module, g: Generation, temperature: float) -> torch.Tensor:
    """What the trainer recomputes: one unpadded fp32 forward over prompt + response, [len(response)]."""
    ids = torch.tensor([[*g.prompt_ids, *g.response_ids]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    p = len(g.prompt_ids)
    logp = torch.log_softmax(logits[p - 1 : -1] / temperature, dim=-1)
    return logp.gather(1, torch.tensor(g.response_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=3, temperature=1.0, max_tokens=16),
        SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9, max_tokens=16),
        SamplingParams(n=1, temperature=0.0, max_tokens=16),
    ],
    ids=["T1", "T0.7-topk-topp", "greedy"],
)
def test_logprobs_match_teacher_forced_fp32(
    engine: TransformersEngine, tiny_dir: Path, prompts: list[list[int]], params: SamplingParams
) -> None:
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    reference = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    out = engine.generate(prompts, params)
    temperature = params.temperature or 1.0
    for gens in out:
        for g in gens:
            assert len(g.logprobs) == len(g.response_ids) > 0
            expected = teacher_forced_logprobs(reference, g, temperature)
            assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


def test_logprobs_exact_when_rows_finish_at_different_steps(
    engine: TransformersEngine, tiny_dir: Path, prompts: list[list[int]]
) -> None:
    """Rows leave the batch and the cache at different steps; the survivors must stay exact."""
    free = engine.generate(prompts, SamplingParams(n=4, max_tokens=12))
    stop_ids = tuple(sorted({g.response_ids[3] for gens in free for g in gens}))[:6]
    reference = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    out = engine.generate(prompts, SamplingParams(n=4, max_tokens=12, stop_token_ids=stop_ids))
    gens = [g for gs in out for g in gs]
    assert len({len(g.response_ids) for g in gens}) > 2
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    for g in gens:
        assert torch.allclose(torch.tensor(g.logprobs), teacher_forced_logprobs(reference, g, 1.0), atol=1e-4)


def test_groups_n_samples_per_prompt(engine: TransformersEngine, prompts: list[list[int]]) -> None:
    out = engine.generate(prompts, SamplingParams(n=4, max_tokens=6))
    assert len(out) == len(prompts)
    for prompt, gens in zip(prompts, out):
        assert len(gens) == 4
        assert all(g.prompt_ids == tuple(prompt) for g in gens)
    assert len({g.response_ids for g in out[0]}) > 1  # samples differ


def test_duplicate_prompts_share_prefill_and_stay_exact(
    engine: TransformersEngine, tiny_dir: Path, prompts: list[list[int]]
) -> None:
    reference = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    batch = [prompts[1], prompts[0], prompts[1]]
    out = engine.generate(batch, SamplingParams(n=2, max_tokens=8))
    for prompt, gens in zip(batch, out):
        for g in gens:
            assert g.prompt_ids == tuple(prompt)
            assert torch.allclose(
                torch.tensor(g.logprobs), teacher_forced_logprobs(reference, g, 1.0), atol=1e-4
            )


def test_max_tokens_gives_length(engine: TransformersEngine, prompts: list[list[int]]) -> None:
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_tokens=5))
    for g in (g for gens in out for g in gens):
        assert len(g.response_ids) <= 5
        if len(g.response_ids) == 5 and g.response_ids[-1] not in engine.eos_ids:
            assert g.finish_reason == "length"


def greedy_reference(tiny_dir: Path, prompt: list[int], max_tokens: int) -> list[int]:
    model = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens)
    return out[0, len(prompt) :].tolist()


def test_greedy_equals_hf_generate_and_is_deterministic(
    engine: TransformersEngine, tiny_dir: Path, prompts: list[list[int]]
) -> None:
    params = SamplingParams(temperature=0, max_tokens=12)
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)
    assert first == again
    for prompt, gens in zip(prompts, first):
        assert list(gens[0].response_ids) == greedy_reference(tiny_dir, prompt, 12)
    # top_k=1 sampling is greedy too
    top1 = engine.generate(prompts, SamplingParams(top_k=1, max_tokens=12))
    assert [g[0].response_ids for g in top1] == [g[0].response_ids for g in first]


def test_eos_finishes_and_stays_in_response(tiny_dir: Path, prompts: list[list[int]]) -> None:
    greedy = greedy_reference(tiny_dir, prompts[0], 12)
    k = 4
    eos = greedy[k]  # declare the token greedy emits at step k an eos of the model
    model = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    model.generation_config.eos_token_id = [model.generation_config.eos_token_id, eos]
    engine = TransformersEngine(model, load_tokenizer(tiny_dir), device="cpu", dtype="float32")
    (g,) = engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=12))[0]
    stop_at = greedy.index(eos)
    assert g.finish_reason == "eos"
    assert list(g.response_ids) == greedy[: stop_at + 1]


def test_stop_token_ids(engine: TransformersEngine, tiny_dir: Path, prompts: list[list[int]]) -> None:
    greedy = greedy_reference(tiny_dir, prompts[0], 12)
    stop_id = greedy[5]
    (g,) = engine.generate(
        [prompts[0]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_id,))
    )[0]
    assert g.finish_reason == "stop"
    assert list(g.response_ids) == greedy[: greedy.index(stop_id) + 1]


@pytest.mark.parametrize("include", [True, False])
def test_stop_string(
    engine: TransformersEngine, tiny_dir: Path, prompts: list[list[int]], include: bool
) -> None:
    tok = engine.tokenizer
    greedy = greedy_reference(tiny_dir, prompts[0], 16)
    stop = tok.decode(greedy[3:5])[-3:]  # ends inside the response, possibly mid-token
    assert stop
    # expected: the shortest prefix whose text contains the stop string
    k = next(k for k in range(1, len(greedy) + 1) if stop in tok.decode(greedy[:k], skip_special_tokens=True))
    params = SamplingParams(temperature=0, max_tokens=16, stop=(stop,), include_stop_str_in_output=include)
    (g,) = engine.generate([prompts[0]], params)[0]
    assert g.finish_reason == "stop"
    assert list(g.response_ids) == greedy[:k]  # tokens kept through the one completing the stop string
    full = tok.decode(greedy[:k], skip_special_tokens=True)
    cut = full.index(stop)
    assert g.text == (full[: cut + len(stop)] if include else full[:cut])


def test_same_seed_same_samples(tiny_dir: Path, prompts: list[list[int]]) -> None:
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=10)
    a = TransformersEngine.from_pretrained(tiny_dir, seed=7).generate(prompts, params)
    b = TransformersEngine.from_pretrained(tiny_dir, seed=7).generate(prompts, params)
    c = TransformersEngine.from_pretrained(tiny_dir, seed=8).generate(prompts, params)
    assert a == b
    assert a != c


def test_update_weights_changes_outputs_and_version(
    engine: TransformersEngine, other_tiny_dir: Path, prompts: list[list[int]]
) -> None:
    params = SamplingParams(temperature=0, max_tokens=10)
    other = TransformersEngine.from_pretrained(other_tiny_dir, seed=0)
    before = engine.generate(prompts, params)
    expected = other.generate(prompts, params)
    assert before != expected
    source = load_causal_lm(other_tiny_dir, dtype="float32", device="cpu")
    source.train()  # a trainer's model: grads on, train mode
    engine.update_weights(source.state_dict(), version=3)
    assert engine.version == 3
    assert engine.generate(prompts, params) == expected


def test_update_weights_accepts_other_dtype_and_untied_keys(
    engine: TransformersEngine, other_tiny_dir: Path
) -> None:
    source = load_causal_lm(other_tiny_dir, dtype="bfloat16", device="cpu").state_dict()
    source.pop("lm_head.weight")  # tied to the embeddings; safetensors files leave it out
    engine.update_weights(source, version=1)
    weight = engine.state_dict()["model.embed_tokens.weight"]
    assert weight.dtype is torch.float32
    assert torch.equal(weight, source["model.embed_tokens.weight"].float())
    assert engine.state_dict()["lm_head.weight"].data_ptr() == weight.data_ptr()


def test_update_weights_rejects_wrong_state_dict(engine: TransformersEngine) -> None:
    good = {k: v.clone() for k, v in engine.state_dict().items()}
    missing = dict(good)
    missing.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"1 missing keys \['model.norm.weight'\]"):
        engine.update_weights(missing, version=1)
    with pytest.raises(ValueError, match=r"unexpected keys \['module.extra'\]"):
        engine.update_weights({**good, "module.extra": torch.zeros(1)}, version=1)
    bad_shape = {**{k: torch.zeros_like(v) for k, v in good.items()}, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"1 shape mismatches .*\['model.norm.weight: \(3,\) vs \(64,\)'\]"):
        engine.update_weights(bad_shape, version=1)
    assert engine.version == 0
    assert all(torch.equal(v, good[k]) for k, v in engine.state_dict().items())  # nothing was copied


def test_rejects_bad_prompts(engine: TransformersEngine) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[10**6]], SamplingParams())
    with pytest.raises(ValueError, match="context"):
        engine.generate([[5] * engine.max_length], SamplingParams())
    assert engine.generate([], SamplingParams()) == []


def test_context_length_caps_max_tokens(engine: TransformersEngine) -> None:
    prompt = [5] * (engine.max_length - 3)
    (g,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=50, stop_token_ids=()))[0]
    assert len(g.response_ids) <= 3


def test_satisfies_protocol(engine: TransformersEngine) -> None:
    assert isinstance(engine, RolloutModel)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_logprobs_match_teacher_forced_fp32(tiny_dir: Path, prompts: list[list[int]]) -> None:
    engine = TransformersEngine.from_pretrained(tiny_dir, device="cuda", dtype="float32", seed=0)
    reference = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0.8, top_p=0.9, max_tokens=12))
    for g in (g for gens in out for g in gens):
        expected = teacher_forced_logprobs(reference, g, 0.8)
        assert torch.allclose(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "options",
    [{"dtype": "bfloat16"}, {"dtype": "float32", "autocast_dtype": "bfloat16"}],
    ids=["bf16-weights", "bf16-autocast"],
)
def test_bf16_options_sample_with_fp32_logprobs_of_their_own_distribution(
    tiny_dir: Path, prompts: list[list[int]], options: dict
) -> None:
    """Lower precision changes the numbers (so the option is really on) by no more than bf16 error, and
    the reported log-probs are fp32 log_softmax of the logits that were sampled from."""
    engine = TransformersEngine.from_pretrained(tiny_dir, seed=0, **options)
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12)
    out = [g for gens in engine.generate(prompts, params) for g in gens]
    reference = load_causal_lm(tiny_dir, dtype="float32", device="cpu")
    gaps = torch.cat(
        [(torch.tensor(g.logprobs) - teacher_forced_logprobs(reference, g, 1.0)).abs() for g in out]
    )
    assert 1e-4 < gaps.max() < 0.05, gaps.max()
    assert all(isinstance(lp, float) for g in out for lp in g.logprobs)
    weights = engine.state_dict()["model.norm.weight"].dtype
    assert weights is (torch.bfloat16 if options["dtype"] == "bfloat16" else torch.float32)
    fp32 = TransformersEngine.from_pretrained(tiny_dir, seed=0, autocast_dtype="float32")
    assert fp32.autocast_dtype is None  # fp32 "autocast" is plain fp32


def test_reserved_layer_behaves_like_dynamic_layer() -> None:
    """The reserved-buffer cache layer against transformers' DynamicLayer through the same operations:
    prefill, appends past its capacity (it grows), row selection with repeats, crop."""
    from transformers.cache_utils import DynamicLayer

    from trivium.models.transformers_engine import ReservedLayer

    ours, theirs = ReservedLayer(capacity=5), DynamicLayer()
    g = torch.Generator().manual_seed(0)

    def step(n_rows: int, n_tokens: int) -> None:
        k, v = (
            torch.randn(n_rows, 2, n_tokens, 4, generator=g),
            torch.randn(n_rows, 2, n_tokens, 3, generator=g),
        )
        a, b = ours.update(k, v), theirs.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    step(2, 3)
    ours.batch_select_indices(torch.tensor([0, 0, 1, 1]))
    theirs.batch_select_indices(torch.tensor([0, 0, 1, 1]))
    for _ in range(4):  # 3 + 4 tokens: past the capacity of 5
        step(4, 1)
    assert ours.get_seq_length() == theirs.get_seq_length() == 7 and ours._keys.shape[2] >= 7
    ours.batch_select_indices(torch.tensor([1, 3]))
    theirs.batch_select_indices(torch.tensor([1, 3]))
    ours.crop(-2)
    theirs.crop(-2)
    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    step(2, 1)
    assert ours.get_seq_length() == 6
    capped = ReservedLayer(capacity=4, max_capacity=6)
    capped.update(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))  # needs 5: 2 x 4 capped at 6
    assert capped._keys.shape[2] == 6
    capped.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))  # past the cap: grows to what it needs
    assert capped._keys.shape[2] == 8 and capped.get_seq_length() == 8
