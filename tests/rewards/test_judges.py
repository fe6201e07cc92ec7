"""Judged rewards against a real OpenAI-compatible HTTP server on 127.0.0.1 (a FastAPI app run by uvicorn):
the API key from the environment, concurrency bounded, replies cached, unparsable replies retried then
counted, failed calls scored 0 by the guard."""

import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import uvicorn
from fastapi import FastAPI, Header, HTTPException

from trivium.rewards import check_reward_args, get_reward_fn
from trivium.rewards.guard import guarded_reward
from trivium.rewards.judge import clear_cache, parse_score, parse_yes_no

KEY = "sk-test-judge"


class Judge:
    """A deterministic judge: 'Score: 1' for answers containing 'good', '0' otherwise, 'hmm' for 'vague'
    (unparsable); yes/no for rubric criteria that are words the answer contains."""

    def __init__(self):
        self.calls, self.in_flight, self.peak = [], 0, 0
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        def chat(body: dict, authorization: str = Header("")):
            if authorization != f"Bearer {KEY}":
                raise HTTPException(401, "bad key")
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            time.sleep(0.05)  # long enough for concurrent calls to overlap
            prompt = body["messages"][-1]["content"]
            with self.lock:
                self.in_flight -= 1
                self.calls.append(prompt)
            answer = re.search(r"Answer: (.*)", prompt).group(1)
            if "criterion: " in prompt:
                word = prompt.split("criterion: ")[1].split("\n")[0]
                text = "yes" if word in answer else "no"
            else:
                text = "hmm, hard to say" if "vague" in answer else f"Score: {int('good' in answer)}"
            message = {"role": "assistant", "content": text}
            return {
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }  # fmt: skip

        self.app = app


@pytest.fixture(scope="module")
def judge():
    j = Judge()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(j.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    j.url = f"http://127.0.0.1:{port}/v1"
    yield j
    server.should_exit = True
    thread.join(10)


@pytest.fixture(autouse=True)
def key_and_fresh_cache(judge, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", KEY)
    clear_cache()
    judge.calls.clear()
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


def test_a_tiny_judge_served_by_trivium_s_own_endpoint(tiny_model_dir):
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
