"""reflect_retry with a real tiny engine and a scripted environment: what is replayed, resampled and trained."""

import logging

import pytest
import torch
from tests.workflows.conftest import EvenEnv
from tests.workflows.test_multi_turn import ENV as COUNTDOWN
from tests.workflows.test_multi_turn import engine, handle, task  # noqa: F401 - the module's engine fixture

from trivium.algorithm.advantages import AdvantageInputs
from trivium.algorithm.registry import ADVANTAGE_FNS
from trivium.types import collate
from trivium.workflows.reflect_retry import ReflectRetryWorkflow

EVEN = "tests.workflows.conftest:EvenEnv"
N = 6


def run(engine, **args):  # noqa: F811
    rec, h = handle(engine, n=N)
    h.params = h.params.__class__(n=N, temperature=1.0, max_tokens=9)  # odd and even lengths both come up
    exps = ReflectRetryWorkflow(env=EVEN, candidates=8, **args).run(task(), h)
    return rec, exps


def by_run(exps):
    out = {}
    for e in sorted(exps, key=lambda e: (e.run_index, e.turn)):
        out.setdefault(e.run_index, []).append(e)
    return out


def test_a_failed_episode_is_retried_from_its_mistake_and_only_the_diverging_turns_are_trained(engine):  # noqa: F811
    rec, exps = run(engine)
    _, (_, second), (pivot_prompts, pivot_out) = rec.calls  # turn 0, turn 1, the retried turn 1
    failed = [r for r in range(N) if len(second[r][0].text) % 2 == 1]
    assert 0 < len(failed) < N, "the seed should give both outcomes; pick another max_tokens if not"
    # One call samples 8 candidates of every failed episode's turn 1, from that episode's own prompt.
    assert pivot_prompts == [rec.calls[1][0][r] for r in failed]
    assert all(len(c) == 8 for c in pivot_out)
    runs = by_run(exps)
    retried = {}
    for j, (r, candidates) in enumerate(zip(failed, pivot_out)):
        chosen = next((g for g in candidates if len(g.text) % 2 == 0), None)
        if chosen is None:  # every candidate repeated the mistake: no retry
            assert N + j not in runs and runs[r][0].metrics["reflect/not_retried"] == 1.0
            continue
        retried[r] = N + j
        (retry,) = runs[N + j]  # the retry from its pivot on: one turn here
        assert retry.turn == 1 and retry.reward == 1.0
        assert retry.tokens[: retry.prompt_length].tolist() == rec.calls[1][0][r]  # the replayed prefix
        assert retry.tokens[retry.prompt_length :].tolist() == list(chosen.response_ids)
        assert torch.allclose(retry.logprobs, torch.tensor(chosen.logprobs))
        assert retry.info["retry_of"] == r and retry.info["pivot"] == 1 and "odd" in retry.info["feedback"]
        assert retry.metrics["retry/success"] == 1.0 and "success" not in retry.metrics
        # pivotal credit: the failed episode keeps only its diverging turn
        assert [e.turn for e in runs[r]] == [1] and runs[r][0].metrics["reflect/retried"] == 1.0
    assert retried, "no retry was made: the test shows nothing"
    for r in set(range(N)) - set(failed):
        assert [e.turn for e in runs[r]] == [0, 1] and runs[r][1].reward == 1.0
        assert runs[r][0].metrics["reflect/failed"] == 0.0
    # The group compares the retries' success with the failed turns: positive there, negative here.
    batch = collate([e.replace(group_id=0) for e in exps], pad_token_id=0)
    inputs = AdvantageInputs.from_batch(batch)
    adv, metrics = ADVANTAGE_FNS.get("step_wise_grpo")(inputs)
    seq_adv = [adv[k][inputs.mask[k]][0] for k in range(len(exps))]  # one value per sequence
    assert metrics["advantage/episodes"] == N + len(retried)
    for k, e in enumerate(exps):
        assert (seq_adv[k] > 0) == (e.reward == 1.0), (e.run_index, e.turn, e.reward)


def test_without_pivotal_credit_the_failed_episode_keeps_its_shared_prefix(engine):  # noqa: F811
    _, exps = run(engine, pivotal_credit=False)
    runs = by_run(exps)
    assert all([e.turn for e in runs[r]] == [0, 1] for r in range(N))
    assert any(r >= N for r in runs)


def test_a_retry_is_not_made_when_the_replay_differs_or_no_candidate_avoids_the_mistake(engine, caplog):  # noqa: F811
    with caplog.at_level(logging.WARNING):
        _, exps = run(engine, env_args={"drift": True})
    assert max(e.run_index for e in exps) < N
    assert "answered differently on replay" in caplog.text
    failed = [e for e in exps if e.metrics["reflect/failed"] == 1.0]
    assert failed and all(e.metrics["reflect/not_retried"] == 1.0 for e in failed)
    rec, exps = run(engine, env_args={"unavoidable": True})
    assert max(e.run_index for e in exps) < N
    assert len(rec.calls) == 3  # the candidates were sampled, none kept
    assert all(env.closed for env in EvenEnv.instances)  # the retries not played were closed too


def test_an_environment_without_diagnose_trains_like_step_wise(engine):  # noqa: F811
    rec, h = handle(engine, n=2)
    exps = ReflectRetryWorkflow(env=COUNTDOWN, env_args={"turns": 2}, retry_below=2.0).run(task(), h)
    assert len(rec.calls) == 2 and sorted((e.run_index, e.turn) for e in exps) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert all(e.metrics["reflect/not_retried"] == 1.0 for e in exps)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"candidates": 0}, "candidates"),
        ({"retry_below": "high"}, "retry_below"),
        ({"max_retries": -1}, "max_retries"),
        ({"pivotal_credit": "yes"}, "pivotal_credit"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, match):
    with pytest.raises(ValueError, match=match):
        ReflectRetryWorkflow(env=EVEN, **args)


def test_positive_scale_multiplies_only_positive_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    mask = torch.ones(4, 1, dtype=torch.bool)
    inputs = AdvantageInputs(
        rewards, torch.zeros(4, dtype=torch.long), mask, torch.arange(4).unsqueeze(1),
        run_ids=torch.arange(4), turns=torch.zeros(4, dtype=torch.long),
    )  # fmt: skip
    fn = ADVANTAGE_FNS.get("step_wise_grpo")
    plain, _ = fn(inputs)
    scaled, _ = fn(inputs, positive_scale=2.0)
    assert torch.allclose(scaled[0], 2 * plain[0]) and torch.equal(scaled[1:], plain[1:])
    assert plain[0, 0] > 0 > plain[1, 0]
    with pytest.raises(ValueError, match="positive_scale"):
        fn(inputs, positive_scale=0.0)
