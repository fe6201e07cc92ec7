"""Judged rewards against a real OpenAI-compatible HTTP server on 127.0.0.1 (a FastAPI app run by uvicorn):
the API key from the environment, concurrency bounded, replies cached, unparsable replies retried then
counted, failed calls scored 0 by the guard."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.rewards.judge_server import KEY, Judge, serving

from trivium.rewards import check_reward_args, get_reward_fn
from trivium.rewards.guard import guarded_reward
from trivium.rewards.judge import clear_cache, parse_score, parse_yes_no


@pytest.fixture(scope="module")
def judge():
    with serving(Judge()) as j:
        yield j


@pytest.fixture(autouse=True)
def key_and_fresh_cache(judge, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", KEY)
    clear_cache()
    judge.calls.clear()
    judge.max_tokens.clear()
    judge.peak = 0


def args(judge, **kw):
    return {"url": judge.url, "api_key_env": "JUDGE_KEY_FOR_TEST", **kw}


def test_scores_are_cached_per_prompt_and_answer(judge):
    reward = get_reward_fn("llm_judge", args(judge))
    data = {"question": "Say something.", "answer": "ref"}
    assert reward("a good one", data).reward == 1.0 and reward("a bad one", data).reward == 0.0
    assert reward("a good one", data).reward == 1.0  # cached: no third call
    assert len(judge.calls) == 2
    assert reward("a good one", {**data, "question": "Other?"}).reward == 1.0 and len(judge.calls) == 3


def test_unparsable_replies_are_retried_then_counted(judge):
    reward = get_reward_fn("llm_judge", args(judge, retries=2))
    result = reward("vague", {"question": "q"})
    assert result.reward == 0.0 and result.metrics["count/judge_unparsable"] == 1.0
    assert result.metrics["count/judge_retries"] == 2 and len(judge.calls) == 3  # 1 + 2 retries
    reward("vague", {"question": "q"})
    assert len(judge.calls) == 6  # an unparsable reply is not cached


def test_calls_run_concurrently_within_the_bound(judge):
    reward = get_reward_fn("llm_judge", args(judge, max_concurrency=3, url=judge.url + "/"))
    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(lambda i: reward(f"good {i}", {"question": "q"}).reward, range(12)))
    assert scores == [1.0] * 12 and len(judge.calls) == 12
    assert 1 < judge.peak <= 3


def test_rubric_weights_the_items_judged_yes(judge):
    rubric = [{"criterion": "apples", "weight": 3}, {"criterion": "pears", "weight": 1}, "plums"]
    reward = get_reward_fn("rubric", args(judge, rubric=rubric))
    result = reward("apples and plums", {"question": "Fruit?"})
    assert result.reward == (3 + 1) / (3 + 1 + 1) and result.metrics["count/judge_unparsable"] == 0.0
    task_rubric = {"question": "Fruit?", "rubric": ["pears"]}  # the task's own rubric wins
    assert reward("pears", task_rubric).reward == 1.0


def test_a_wrong_key_or_a_dead_server_is_scored_zero_by_the_guard(judge, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "wrong")
    from trivium.rewards import judge as judge_module

    judge_module._clients.clear()  # clients are made once per (url, key variable, timeout)
    result = guarded_reward("llm_judge", args(judge, timeout_s=5.0), timeout_s=30)("good", {})
    assert result.reward == 0.0 and result.metrics["count/reward_error"] == 1.0
    judge_module._clients.clear()


def test_parsers_and_args():
    assert parse_score("Score: 0.75") == 0.75 and parse_score("8", scale=10) == 0.8
    assert parse_score("12") is None and parse_score("none") is None
    assert (
        parse_yes_no("Yes, it does.") == 1.0 and parse_yes_no("no") == 0.0 and parse_yes_no("maybe") is None
    )
    with pytest.raises(ValueError, match=r"reward_args\.url"):
        check_reward_args("llm_judge", {"url": "localhost:8000"})
    with pytest.raises(ValueError, match="max_concurrency"):
        check_reward_args("rubric", {"url": "http://x/v1", "max_concurrency": 0})
    # the judge settings are collected in **judge, and a typo is still named with every valid key
    with pytest.raises(TypeError, match=r"\['urll'\]; valid args: .*api_key_env.*prompt.*scale.*url"):
        check_reward_args("llm_judge", {"urll": "http://x/v1"})


def test_judge_plumbing_on_trivium_s_own_endpoint_every_answer_scored_in_range(tiny_model_dir):
    """The plumbing against the real endpoint: an untrained judge mostly replies nonsense, so the parse-
    failure path runs; whatever it says, every answer gets a score in [0, 1] and a parsed one is cached."""
    from trivium.models.batching import BatchingRolloutModel
    from trivium.models.transformers_engine import TransformersEngine
    from trivium.rewards import judge as judge_module
    from trivium.serve.openai_server import OpenAIServer

    engine = BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))
    with OpenAIServer(engine, model_name="tiny", api_key=KEY) as server:
        reward = get_reward_fn(
            "llm_judge",
            {"url": f"{server.url}/v1", "model": "tiny", "api_key_env": "JUDGE_KEY_FOR_TEST", "scale": 100,
             "retries": 1, "temperature": 1.0, "max_tokens": 6, "max_concurrency": 4},
        )  # fmt: skip
        answers = [f"{n} apples" for n in (3, 5, 7, 9, 11, 13)]  # distinct: see judge.py on the cache
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda a: reward(a, {"question": "How many apples?"}), answers))
        for r in results:
            assert 0.0 <= r.reward <= 1.0
            assert r.metrics["count/judge_unparsable"] in (0.0, 1.0)
            assert r.metrics["count/judge_retries"] <= 1
            if r.metrics["count/judge_unparsable"]:
                assert r.reward == 0.0 and r.metrics["count/judge_retries"] == 1
        parsed = [a for a, r in zip(answers, results) if not r.metrics["count/judge_unparsable"]]
        cached = len(judge_module._cache)
        for a in parsed:  # a parsed verdict is served from the cache: the same score, no new call
            again = reward(a, {"question": "How many apples?"})
            assert again.reward == results[answers.index(a)].reward
        assert len(judge_module._cache) == cached


def group_of(*responses, task="t0", question="Name a fruit."):
    """A group of single-turn experiences as the math workflow makes them (chat kept in info)."""
    import torch

    from trivium.types import Experience

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    return [
        Experience(
            tokens=torch.arange(4),
            prompt_length=2,
            action_mask=torch.ones(2, dtype=torch.bool),
            logprobs=torch.zeros(2),
            reward=0.25,
            task_id=task,
            run_index=i,
            info={"response": r, "messages": chat},
        )
        for i, r in enumerate(responses)
    ]


def test_ruler_scores_a_whole_group_in_one_call_and_counts_what_it_could_not(judge):
    from trivium.buffer.operators import ExperiencePipeline

    pipeline = ExperiencePipeline([("ruler", args(judge, retries=1))])
    groups = [
        group_of("a good pear", "an ok plum", "a rock"),
        group_of("good", "vague", task="t1"),  # unparsable twice: rewards stay
        group_of("alone", task="t2"),  # one answer: nothing to rank, no call
    ]
    out, metrics = pipeline(groups)
    assert [e.reward for e in out[0]] == [1.0, 0.5, 0.0]
    assert [e.reward for e in out[1]] == [0.25, 0.25] and [e.reward for e in out[2]] == [0.25]
    ranking_calls = [c for c in judge.calls if "candidate answers" in c]
    assert len(ranking_calls) == 1 + 2  # one per group, the unparsable one asked again once
    assert "Name a fruit." in ranking_calls[0] and "Be brief." not in ranking_calls[0]
    assert metrics["ops/ruler/judged_groups"] == 1 and metrics["ops/ruler/unparsable_groups"] == 1
    assert metrics["ops/ruler/failed_groups"] == 0 and metrics["ops/ruler/changed"] == 3
    assert metrics["ops/ruler/reward_mean"] == pytest.approx((1.5 + 0.25 * 3) / 6)
    pipeline(groups[:1])  # the same group again: served from the cache
    assert len([c for c in judge.calls if "candidate answers" in c]) == 3

    added, _ = ExperiencePipeline([("ruler", args(judge, weight=2.0, add=True))])(groups[:1])
    assert [e.reward for e in added[0]] == [2.25, 1.25, 0.25]


def test_the_ruler_judge_keeps_its_own_reply_length_under_the_policy_s(judge):
    """The pipeline gives operators that take max_tokens the policy's response limit (overlong penalty);
    the ruler's max_tokens was the judge's reply length and got that limit too (a 24-token ranking reply
    for a 24-token policy). Its judge settings now keep their own default, and an explicit one wins."""
    from trivium.buffer.operators import ExperiencePipeline

    ExperiencePipeline([("ruler", args(judge))], max_tokens=24)([group_of("good", "a rock")])
    ExperiencePipeline([("ruler", args(judge, max_tokens=64))], max_tokens=24)([group_of("ok", "no")])
    assert judge.max_tokens == [256, 64]


def test_ruler_keeps_rewards_when_the_judge_fails_and_checks_its_args(judge, monkeypatch):
    from trivium.buffer.operators import ExperiencePipeline
    from trivium.rewards import judge as judge_module
    from trivium.rewards.ruler import parse_ranking

    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "wrong")
    judge_module._clients.clear()
    out, metrics = ExperiencePipeline([("ruler", args(judge, timeout_s=5.0))])(
        [group_of("good", "bad", question="Other?")]
    )
    judge_module._clients.clear()
    assert [e.reward for e in out[0]] == [0.25, 0.25] and metrics["ops/ruler/failed_groups"] == 1

    with pytest.raises(ValueError, match=r"ruler operator's args\.url"):
        ExperiencePipeline([("ruler", {"url": "localhost:8000"})])
    assert parse_ranking("1: 0.9\n2: 0.1", 2) == [0.9, 0.1] and parse_ranking("[7, 3]", 2, scale=10) == [
        0.7,
        0.3,
    ]
    assert parse_ranking("Answer 1: 0.9", 2) is None  # answer 2 has no score
    assert parse_ranking("1: 0.9\n1: 0.2\n2: 0.1", 2) is None and parse_ranking("1: 3\n2: 0", 2) is None


def test_a_judge_model_served_in_process_by_model_path(tiny_model_dir, tmp_path):
    """``model_path`` instead of ``url``: the judge is loaded into this process and served by Trivium's own
    endpoint on 127.0.0.1, one per model for every judge that names it."""
    from trivium.buffer.operators import ExperiencePipeline
    from trivium.rewards import judge as judge_module

    local = {"model_path": str(tiny_model_dir), "retries": 0, "temperature": 1.0}
    check_reward_args("llm_judge", local)
    try:
        score = get_reward_fn("llm_judge", {**local, "scale": 100, "max_tokens": 4})(
            "3 apples", {"question": "?"}
        )
        rubric = get_reward_fn("rubric", {**local, "rubric": ["apples"], "max_tokens": 2})("3 apples", {})
        _, metrics = ExperiencePipeline([("ruler", {**local, "max_tokens": 8})])([group_of("a", "b")])
        assert 0.0 <= score.reward <= 1.0 and rubric.reward in (0.0, 1.0)
        assert sum(metrics[f"ops/ruler/{k}_groups"] for k in ("judged", "unparsable", "failed")) == 1
        assert metrics["ops/ruler/failed_groups"] == 0  # the call went through, whatever the tiny model said
        assert len(judge_module._local) == 1  # one engine and endpoint for the three judges
    finally:
        for server in judge_module._local.values():
            server.stop()
        judge_module._local.clear()
    with pytest.raises(ValueError, match="not both"):
        check_reward_args("llm_judge", {**local, "url": "http://127.0.0.1:1/v1"})
    with pytest.raises(ValueError, match=r"model_path .*no such folder"):
        check_reward_args("rubric", {"model_path": str(tmp_path / "missing" / "judge")})
