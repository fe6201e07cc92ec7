"""The OpenAI-compatible endpoint, through a real uvicorn server on 127.0.0.1 and the real ``openai`` client."""

from __future__ import annotations

import itertools
import json
import threading
import time

import openai
import pytest
import torch

from trivium.models.batching import BatchingRolloutModel
from trivium.models.chat import render_ids
from trivium.models.protocol import Generation
from trivium.serve.openai_server import OpenAIServer
from trivium.serve.recorder import Recorder
from trivium.serve.responses import chat_choice, chat_stream
from trivium.serve.schemas import ChatCompletionResponse, Usage
from trivium.tools.calls import format_tool_call

KEY = "test-key"
QUESTION = [{"role": "user", "content": "Tom has 12 apples and gets 3 more. How many apples now?"}]


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def server(engine, recorder):
    with OpenAIServer(engine, model_name="tiny", recorder=recorder, api_key=KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client()


def test_health_models_and_api_key(server, client, raw_http):
    status, health = raw_http("GET", f"{server.url}/health")  # open, no key needed
    assert status == 200 and health["status"] == "ok" and health["model"] == "tiny" and health["version"] == 0
    assert [m.id for m in client.models.list().data] == ["tiny"]

    for key in (None, "wrong-key"):
        status, body = raw_http("GET", f"{server.base_url}/models", key=key)
        assert status == 401 and "Authorization: Bearer" in body["error"]["message"], body
    bad = openai.OpenAI(base_url=server.base_url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2)
    assert raw_http("GET", f"{server.base_url}/models", key=KEY)[0] == 200


def test_chat_token_ids_and_logprobs_match_a_teacher_forced_pass(client, engine, tokenizer, teacher_forced):
    """Sampled at T = 0.7: the returned log-probs are log_softmax(logits / 0.7) of one fp32 forward pass."""
    response = client.chat.completions.create(
        model="anything", messages=QUESTION, max_tokens=12, temperature=0.7, logprobs=True
    )
    choice = response.choices[0]
    prompt, ids = response.prompt_token_ids, choice.token_ids
    assert prompt == render_ids(tokenizer, QUESTION, True)
    assert response.id.startswith("chatcmpl-") and response.model == "tiny" and response.model_version == 0
    assert response.usage.prompt_tokens == len(prompt) and response.usage.completion_tokens == len(ids)
    reported = [t.logprob for t in choice.logprobs.content]
    expected = teacher_forced(engine, prompt, ids, temperature=0.7)
    assert len(reported) == len(ids) and max(abs(a - b) for a, b in zip(reported, expected)) < 1e-4
    # Token strings and bytes: the bytes of all tokens are the exact UTF-8 of the decoded reply.
    joined = b"".join(bytes(t.bytes) for t in choice.logprobs.content)
    assert joined.decode("utf-8", errors="replace") == tokenizer.decode(ids, skip_special_tokens=False)
    assert choice.message.content == tokenizer.decode(ids, skip_special_tokens=True)


def test_completions_with_text_and_token_id_prompts(client, engine, tokenizer, teacher_forced):
    prompt_ids = tokenizer("Ann has 7 pens.")["input_ids"]
    by_ids = client.completions.create(
        model="tiny", prompt=prompt_ids, max_tokens=10, temperature=0, logprobs=0
    )
    by_text = client.completions.create(model="tiny", prompt="Ann has 7 pens.", max_tokens=10, temperature=0)
    assert by_ids.prompt_token_ids == by_text.prompt_token_ids == prompt_ids
    a, b = by_ids.choices[0], by_text.choices[0]
    assert a.token_ids == b.token_ids and a.text == b.text and b.logprobs is None  # greedy: the same reply
    expected = teacher_forced(engine, prompt_ids, a.token_ids)  # greedy reports T = 1 log-probs
    assert max(abs(x - y) for x, y in zip(a.logprobs.token_logprobs, expected)) < 1e-4
    assert len(a.logprobs.tokens) == len(a.logprobs.text_offset) == len(a.token_ids)


def test_stop_strings_cut_the_text_but_keep_the_sampled_tokens(client, tokenizer):
    """OpenAI semantics for the text (stop string left out); the ids end with the token that completed it."""
    full = client.completions.create(model="tiny", prompt="Sam has", max_tokens=12, temperature=0).choices[0]
    stop = full.text[2:5]  # a string that occurs in the greedy reply, not at its very start
    cut = client.completions.create(model="tiny", prompt="Sam has", max_tokens=12, temperature=0, stop=[stop])
    choice = cut.choices[0]
    assert choice.finish_reason == "stop" and choice.text == full.text[: full.text.index(stop)]
    ids = choice.token_ids
    assert ids == full.token_ids[: len(ids)]
    assert stop in tokenizer.decode(ids) and stop not in tokenizer.decode(ids[:-1])


def test_streaming_replays_the_greedy_reply(client):
    plain = client.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=16, temperature=0, logprobs=True
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=QUESTION,
            max_tokens=16,
            temperature=0,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert deltas[0].delta.role == "assistant"
    assert chunks[0].prompt_token_ids == plain.prompt_token_ids
    assert "".join(d.delta.content or "" for d in deltas) == plain.choices[0].message.content
    assert [t for d in deltas for t in d.token_ids] == plain.choices[0].token_ids
    streamed_lps = [t.model_dump() for d in deltas if d.logprobs for t in d.logprobs.content]
    assert streamed_lps == [t.model_dump() for t in plain.choices[0].logprobs.content]
    assert deltas[-1].finish_reason == plain.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens

    plain_text = client.completions.create(model="tiny", prompt="Sam has", max_tokens=12, temperature=0)
    streamed = list(
        client.completions.create(model="tiny", prompt="Sam has", max_tokens=12, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed) == plain_text.choices[0].text
    assert [t for c in streamed for t in c.choices[0].token_ids] == plain_text.choices[0].token_ids


def test_n_choices_are_recorded_as_one_call(client, recorder):
    before = len(recorder.default.calls)
    response = client.chat.completions.create(
        model="tiny", messages=QUESTION, n=3, max_tokens=8, temperature=1.0
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    call = recorder.default.calls[before]
    assert call.call_id == response.id and len(call.choices) == 3
    assert [list(c.response_ids) for c in call.choices] == [c.token_ids for c in response.choices]
    with pytest.raises(ValueError, match="choices"):
        _ = call.response_ids  # ambiguous for n > 1


def test_tools_are_rendered_and_the_reply_returned(client, tokenizer, calculator):
    """A random tiny model will not write a tool call; the request with tools renders and returns."""
    messages = [
        QUESTION[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": json.dumps({"expression": "12 + 3"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "15"},
    ]
    response = client.chat.completions.create(
        model="tiny", messages=messages, tools=[calculator], max_tokens=8, temperature=0
    )
    template = [
        messages[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    **messages[1]["tool_calls"][0],
                    "function": {"name": "calculator", "arguments": {"expression": "12 + 3"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "15"},
    ]
    assert response.prompt_token_ids == render_ids(tokenizer, template, True, [calculator])
    rendered = tokenizer.decode(response.prompt_token_ids)
    assert '"name": "calculator"' in rendered and "<tool_response>\n15\n</tool_response>" in rendered
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")


def test_the_response_builder_parses_tool_calls(tokenizer):
    """A fixed generation holding a tool-call block: what the endpoint returns and streams for it."""
    text = "Let me compute.\n" + format_tool_call("calculator", {"expression": "12 + 3"})
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    gen = Generation((5, 6), tuple(ids), tuple([-0.25] * len(ids)), "eos", text)

    turn = chat_choice(gen, 0, tokenizer, parse_tools=True, logprobs=True, call_prefix="call_x")
    call = turn.choice.message.tool_calls[0]
    assert turn.choice.finish_reason == "tool_calls" and turn.choice.message.content == "Let me compute."
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {
        "expression": "12 + 3"
    }
    assert turn.message["tool_calls"][0]["function"]["arguments"] == {"expression": "12 + 3"}
    assert turn.choice.token_ids == ids and [t.logprob for t in turn.choice.logprobs.content] == [
        -0.25
    ] * len(ids)

    plain = chat_choice(gen, 0, tokenizer, parse_tools=False, logprobs=False, call_prefix="call_x")
    assert plain.choice.message.content == text and plain.choice.message.tool_calls is None
    assert plain.choice.finish_reason == "stop"
    broken = Generation((5,), (7, 8), (-1.0, -1.0), "length", "<tool_call>\n{not json}\n</tool_call>")
    bad = chat_choice(broken, 0, tokenizer, parse_tools=True, logprobs=False, call_prefix="call_x")
    assert bad.choice.message.content == broken.text and bad.choice.message.tool_calls is None
    assert bad.choice.finish_reason == "length" and "not JSON" in bad.choice.tool_call_errors[0]

    response = ChatCompletionResponse(
        id="chatcmpl-x",
        created=0,
        model="tiny",
        choices=[turn.choice],
        usage=Usage(prompt_tokens=2, completion_tokens=len(ids), total_tokens=2 + len(ids)),
        prompt_token_ids=[5, 6],
        model_version=0,
    )
    events = list(chat_stream(response, tokenizer, include_usage=False))
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate_json(e[6:]) for e in events[:-1]]
    streamed = [c for chunk in chunks for d in chunk.choices for c in d.delta.tool_calls or ()]
    assert [(c.index, c.id, c.function.name) for c in streamed] == [(0, call.id, "calculator")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


BAD_REQUESTS = [
    ("chat", {"messages": []}, "messages"),
    ("chat", {}, "messages"),
    ("chat", {"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ("chat", {"messages": [{"role": "user"}]}, "messages.0"),
    ("chat", {"messages": QUESTION, "n": 0}, "n"),
    ("chat", {"messages": QUESTION, "temperature": -1}, "temperature"),
    ("chat", {"messages": QUESTION, "top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ("chat", {"messages": [{"role": "user", "content": "Tom has 3 apples. " * 300}]}, "messages"),
    (
        "chat",
        {"messages": QUESTION, "tools": [{"type": "function", "function": {"name": "no spaces!"}}]},
        "tools.0",
    ),
    (
        "chat",
        {
            "messages": QUESTION,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
        },
        "tools.0",
    ),
    (
        "chat",
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{oops"}}],
                }
            ]
        },
        "messages.0.tool_calls.0.function.arguments",
    ),
    ("completions", {"prompt": [1, 2, 10**6]}, "prompt"),
    ("completions", {"prompt": list(range(600))}, "prompt"),
    ("completions", {"prompt": ["one", "two"]}, "prompt"),
    ("completions", {"prompt": "hi", "echo": True}, "echo"),
]


@pytest.mark.parametrize(("route", "body", "param"), BAD_REQUESTS, ids=[p for _, _, p in BAD_REQUESTS])
def test_bad_requests_are_refused_and_the_server_stays_up(server, client, raw_http, route, body, param):
    status, reply = raw_http(
        "POST", f"{server.base_url}/{route.replace('chat', 'chat/completions')}", body, KEY
    )
    assert 400 <= status < 500, reply
    error = reply["error"]
    assert error["param"] == param and param in error["message"] and error["type"] == "invalid_request_error"
    assert client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2).choices


def test_malformed_json_unknown_routes_and_sessions(server, raw_http):
    status, reply = raw_http("POST", f"{server.base_url}/chat/completions", b"{not json", KEY)
    assert status == 400 and "JSON" in reply["error"]["message"]
    status, reply = raw_http(
        "POST", f"{server.url}/sessions/nope/v1/chat/completions", {"messages": QUESTION}, KEY
    )
    assert status == 404 and "'nope'" in reply["error"]["message"] and reply["error"]["param"] == "session_id"
    status, reply = raw_http("GET", f"{server.url}/v2/nothing", None, KEY)
    assert status == 404 and "/v2/nothing" in reply["error"]["message"]


def test_weight_updates_show_in_health_and_recorded_calls(server, client, engine, recorder, raw_http):
    state = {k: v.clone() for k, v in engine.state_dict().items()}
    engine.update_weights(state, version=7)
    try:
        assert raw_http("GET", f"{server.url}/health")[1]["version"] == 7
        response = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2)
        assert response.model_version == 7 and recorder.default.calls[-1].model_version == 7
    finally:
        engine.update_weights(state, version=0)


def test_concurrent_agents_are_batched_and_never_mix(engine):
    """Two agents in threads, each in its own session, three turns each, calls made at the same moment."""
    batching = BatchingRolloutModel(engine, max_wait_s=0.3)
    recorder = Recorder(default_session=None)
    barrier = threading.Barrier(2)
    returned: dict[str, list] = {}

    def agent(name: str) -> None:
        session = recorder.session(f"agent-{name}")
        client = session.client()
        messages = [{"role": "user", "content": f"I am agent {name}. Count the coins."}]
        for turn in range(3):
            barrier.wait(timeout=30)
            response = client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=6, temperature=1.0
            )
            returned.setdefault(name, []).append(
                (response.id, response.prompt_token_ids, response.choices[0].token_ids)
            )
            messages += [
                response.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": f"{name} {turn}"},
            ]

    with OpenAIServer(batching, model_name="tiny", recorder=recorder):
        threads = [threading.Thread(target=agent, args=(n,)) for n in ("A", "B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert len(returned["A"]) == len(returned["B"]) == 3
    assert batching.requests == 6 and batching.engine_calls < 6  # some calls shared a batch

    for name, other in (("A", "B"), ("B", "A")):
        session = recorder.sessions[f"agent-{name}"]
        calls = session.calls
        assert [c.call_id for c in calls] == [r[0] for r in returned[name]]
        assert all(f"agent {name}" in c.messages[0]["content"] for c in calls)
        assert not any(f"agent {other}" in m["content"] for c in calls for m in c.messages)
        steps = session.experiences(1.0, mode="step")
        assert [e.tokens.tolist() for e in steps] == [p + r for _, p, r in returned[name]]
        episode = session.experiences(1.0, mode="concat")[0]
        actions = episode.tokens[episode.prompt_length :][episode.action_mask].tolist()
        assert actions == [t for _, _, r in returned[name] for t in r]


def test_a_waiting_generation_does_not_block_the_server(engine, raw_http):
    """A request held 1 s in the batching queue; /health answers meanwhile (the event loop is free)."""
    batching = BatchingRolloutModel(engine, max_wait_s=1.0)
    with OpenAIServer(batching, model_name="tiny") as server:
        chat = threading.Thread(
            target=raw_http,
            args=("POST", f"{server.base_url}/chat/completions", {"messages": QUESTION, "max_tokens": 2}),
        )
        chat.start()
        while batching.requests == 0:  # the request reached generate() and now waits for its batch
            time.sleep(0.005)
        assert raw_http("GET", f"{server.url}/health")[0] == 200
        assert chat.is_alive()
        chat.join(timeout=30)
    assert batching.engine_calls == 1


def test_three_turns_reuse_the_sampled_tokens(engine, recorder, server, tokenizer):
    """Agent sends back each reply and a new user turn: one concat experience, byte for byte the replies."""
    session = recorder.session(metadata={"task": "three-turns"})
    client = session.client()
    messages = [QUESTION[0]]
    responses = []
    for turn in range(3):
        response = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=10, temperature=1.0, logprobs=True
        )
        responses.append(response)
        messages += [
            response.choices[0].message.model_dump(),
            {"role": "user", "content": f"And then? ({turn})"},
        ]
    assert [r.prefix_reused for r in responses] == [False, True, True]
    for before, after in itertools.pairwise(responses):
        sampled = before.prompt_token_ids + before.choices[0].token_ids
        assert after.prompt_token_ids[: len(sampled)] == sampled

    (episode,) = session.experiences(0.5, mode="concat", task_id="t1", run_index=2)
    last = responses[-1]
    assert episode.tokens.tolist() == last.prompt_token_ids + last.choices[0].token_ids
    assert episode.prompt_length == len(responses[0].prompt_token_ids)
    response_part = episode.tokens[episode.prompt_length :]
    assert response_part[episode.action_mask].tolist() == [
        t for r in responses for t in r.choices[0].token_ids
    ]
    env = response_part[~episode.action_mask].tolist()
    between = [
        after.prompt_token_ids[len(before.prompt_token_ids) + len(before.choices[0].token_ids) :]
        for before, after in itertools.pairwise(responses)
    ]
    assert env == [t for part in between for t in part] and "And then? (0)" in tokenizer.decode(env)
    reported = [t.logprob for r in responses for t in r.choices[0].logprobs.content]
    assert episode.logprobs[episode.action_mask].tolist() == reported  # fp32 values, exactly
    assert torch.all(episode.logprobs[~episode.action_mask] == 0)
    assert episode.reward == 0.5 and episode.task_id == "t1" and episode.run_index == 2
    assert episode.info["call_ids"] == [r.id for r in responses] and episode.metrics["num_calls"] == 3
