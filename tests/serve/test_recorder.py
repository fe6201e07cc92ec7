"""Recording sessions: routing, prefix reuse (token-in/token-out chat), experiences and the on_call hook."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from trivium.models.chat import render_ids
from trivium.models.protocol import Generation, SamplingParams
from trivium.serve.openai_server import OpenAIServer
from trivium.serve.recorder import Recorder, RecordingSession
from trivium.serve.responses import chat_choice
from trivium.serve.schemas import ChatMessage
from trivium.serve.service import chat_call
from trivium.tools.calls import format_tool_call

USER = {"role": "user", "content": "What is 12 + 30?"}


def reply(tokenizer, prompt: list[int], text: str, eos: bool = True) -> Generation:
    """A fixed generation: ``text`` tokenised (plus eos), as an engine would have sampled it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
    logprobs = tuple(-0.1 * (k + 1) for k in range(len(ids)))
    return Generation(tuple(prompt), tuple(ids), logprobs, "eos" if eos else "length", text)


def record_chat(session: RecordingSession, tokenizer, messages, tools, text: str, call_id: str, eos=True):
    """What the server does for one chat request, with a fixed reply instead of a sampled one."""
    messages = [ChatMessage(**m).template() for m in messages]
    prompt = session.prepare_chat(tokenizer, messages, tools)
    gen = reply(tokenizer, prompt.ids, text, eos)
    turn = chat_choice(
        gen, 0, tokenizer, parse_tools=bool(tools), logprobs=False, call_prefix=f"call_{call_id}"
    )
    params = SamplingParams()
    call = chat_call(
        call_id,
        session.session_id,
        prompt,
        [gen],
        [turn],
        messages=messages,
        tools=tools,
        params=params,
        version=3,
        created=0.0,
    )
    session.record(call, [gen], prompt)
    return call, turn


def test_a_tool_call_turn_is_continued_token_for_token(tokenizer, calculator):
    """The agent sends back the tool call it got (arguments as a JSON string) and the tool's result."""
    session = Recorder(default_session=None).session("tools")
    text = format_tool_call("calculator", {"expression": "12 + 30"})
    first, turn = record_chat(session, tokenizer, [USER], [calculator], text, "c1")
    assert not first.prefix_reused and first.finish_reason == "tool_calls"
    assert first.prompt_ids == tuple(render_ids(tokenizer, [USER], True, [calculator]))

    returned = turn.choice.message.model_dump(exclude_none=True)  # what the OpenAI client hands the agent
    assert isinstance(returned["tool_calls"][0]["function"]["arguments"], str)
    tool = {"role": "tool", "tool_call_id": returned["tool_calls"][0]["id"], "content": "42"}
    second, _ = record_chat(session, tokenizer, [USER, returned, tool], [calculator], "It is 42.", "c2")
    assert second.prefix_reused and second.continued_call_id == "c1"
    sampled = list(first.prompt_ids + first.response_ids)
    assert list(second.prompt_ids[: len(sampled)]) == sampled
    between = tokenizer.decode(list(second.prompt_ids[len(sampled) :]))
    assert "<tool_response>\n42\n</tool_response>" in between and between.endswith("<|assistant|>\n")

    (episode,) = session.experiences(1.0, mode="concat")
    assert episode.tokens.tolist() == list(second.prompt_ids + second.response_ids)
    response = episode.tokens[episode.prompt_length :]
    assert response[episode.action_mask].tolist() == list(first.response_ids + second.response_ids)
    assert tokenizer.decode(response[~episode.action_mask].tolist()) == between
    assert episode.logprobs[episode.action_mask].tolist() == pytest.approx(first.logprobs + second.logprobs)
    assert episode.model_version == 3 and episode.info["call_ids"] == ["c1", "c2"]


def test_a_reply_cut_by_max_tokens_keeps_its_tokens(tokenizer):
    """No eos sampled: the template's end-of-turn token is added as an environment token (mask False)."""
    session = Recorder(default_session=None).session()
    first, turn = record_chat(session, tokenizer, [USER], None, "12 + 30 is", "c1", eos=False)
    returned = turn.choice.message.model_dump()
    second, _ = record_chat(
        session, tokenizer, [USER, returned, {"role": "user", "content": "Go on."}], None, "42", "c2"
    )
    assert second.prefix_reused
    glue = list(second.prompt_ids[len(first.prompt_ids) + len(first.response_ids) :])
    assert glue[0] == tokenizer.eos_token_id  # the end-of-turn token the model did not sample


def test_an_edited_history_is_rendered_afresh_and_concat_refuses(tokenizer):
    session = Recorder(default_session=None).session()
    record_chat(session, tokenizer, [USER], None, "Maybe 41?", "c1")
    edited = [USER, {"role": "assistant", "content": "It is 42."}, {"role": "user", "content": "Sure?"}]
    second, _ = record_chat(session, tokenizer, edited, None, "Yes.", "c2")
    assert not second.prefix_reused and second.continued_call_id is None
    assert list(second.prompt_ids) == render_ids(
        tokenizer, [ChatMessage(**m).template() for m in edited], True
    )
    with pytest.raises(ValueError, match=r"call 1 \(c2\) does not continue call 0 \(c1\).*mode='step'"):
        session.experiences(1.0, mode="concat")
    steps = session.experiences(1.0, mode="step", task_id="t", run_index=1)
    assert [e.turn for e in steps] == [0, 1] and [e.info["call_ids"] for e in steps] == [["c1"], ["c2"]]
    assert all(e.action_mask.all() and e.task_id == "t" and e.run_index == 1 for e in steps)
    assert steps[1].tokens.tolist() == list(second.prompt_ids + second.response_ids)


def test_session_ids_and_lifecycle():
    recorder = Recorder(default_session=None)
    assert recorder.get(None) is None  # plain /v1 is not recorded
    session = recorder.session("run-1", metadata={"task": 7})
    assert recorder.get("run-1") is session and session.metadata == {"task": 7}
    with pytest.raises(ValueError, match="already exists"):
        recorder.session("run-1")
    with pytest.raises(ValueError, match="URL part"):
        recorder.session("a/b")
    with pytest.raises(ValueError, match="no recorded calls"):
        session.experiences(1.0)
    with pytest.raises(RuntimeError, match="start an OpenAIServer"):
        session.client()
    with session:
        pass
    with pytest.raises(LookupError, match="'run-1' does not exist or was closed"):
        recorder.get("run-1")
    assert Recorder().get(None).session_id == "default"


@pytest.fixture(scope="module")
def hooked(engine):
    """A server whose recorder's on_call fails while ``state["fail"]`` is set."""
    state = {"fail": False, "seen": []}

    def on_call(call):
        if state["fail"]:
            raise RuntimeError("the buffer is down")
        state["seen"].append(call)

    recorder = Recorder(on_call=on_call, default_session=None)
    with OpenAIServer(engine, model_name="tiny", recorder=recorder) as server:
        yield server, recorder, state


def test_on_call_sees_every_call_and_its_failure_fails_the_request(hooked):
    _, recorder, state = hooked
    session = recorder.session()
    client = session.client()
    ok = client.chat.completions.create(model="tiny", messages=[USER], max_tokens=4)
    assert [c.call_id for c in state["seen"]] == [ok.id] and state["seen"][0].session_id == session.session_id
    state["fail"] = True
    try:
        with pytest.raises(openai.InternalServerError, match="the buffer is down"):
            client.chat.completions.create(model="tiny", messages=[USER], max_tokens=4)
    finally:
        state["fail"] = False
    assert [c.call_id for c in session.calls] == [ok.id]  # the failed call is not recorded
    assert (
        client.chat.completions.create(model="tiny", messages=[USER], max_tokens=4).id
        == session.calls[-1].call_id
    )


def test_plain_v1_without_default_session_is_served_but_not_recorded(hooked, raw_http):
    server, _, state = hooked
    before = len(state["seen"])
    status, body = raw_http(
        "POST", f"{server.base_url}/chat/completions", {"messages": [USER], "max_tokens": 3}
    )
    assert status == 200 and body["id"].startswith("chatcmpl-") and len(state["seen"]) == before


def test_a_server_without_recorder_has_no_sessions(engine, raw_http):
    with OpenAIServer(engine, model_name="tiny") as server:
        status, body = raw_http(
            "POST", f"{server.url}/sessions/s1/v1/completions", {"prompt": "Hi", "max_tokens": 2}
        )
        assert status == 404 and "without a recorder" in body["error"]["message"]
        status, body = raw_http("POST", f"{server.base_url}/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 200 and len(body["choices"][0]["token_ids"]) <= 2


def test_async_client_calls_in_one_session_are_all_recorded(hooked):
    _, recorder, _ = hooked
    session = recorder.session()

    async def run() -> list[str]:
        client = session.async_client()
        replies = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"Q{k}"}], max_tokens=3
                )
                for k in range(3)
            )
        )
        await client.close()
        return [r.id for r in replies]

    ids = asyncio.run(run())
    assert sorted(c.call_id for c in session.calls) == sorted(ids)


def test_completion_calls_concatenate_by_tokens_and_n_needs_step_mode(hooked, tokenizer):
    """Raw token-in agents: a prompt that extends the last prompt and reply is one episode."""
    _, recorder, _ = hooked
    session = recorder.session()
    client = session.client()
    start = tokenizer("Mia has 4 cards.", add_special_tokens=False)["input_ids"]
    first = client.completions.create(model="tiny", prompt=start, max_tokens=5, logprobs=0)
    env = tokenizer("\nObservation: ok\n", add_special_tokens=False)["input_ids"]
    second_prompt = start + first.choices[0].token_ids + env
    second = client.completions.create(model="tiny", prompt=second_prompt, max_tokens=5, logprobs=0)

    (episode,) = session.experiences(2.0, mode="concat")
    assert episode.tokens.tolist() == second_prompt + second.choices[0].token_ids
    expected_mask = (
        [True] * len(first.choices[0].token_ids)
        + [False] * len(env)
        + [True] * len(second.choices[0].token_ids)
    )
    assert episode.action_mask.tolist() == expected_mask
    lps = first.choices[0].logprobs.token_logprobs + second.choices[0].logprobs.token_logprobs
    assert episode.logprobs[episode.action_mask].tolist() == lps
    assert session.calls[0].prompt == tuple(start) and session.calls[0].kind == "completion"

    many = client.completions.create(model="tiny", prompt="Ben has", n=2, max_tokens=3)
    with pytest.raises(ValueError, match="n > 1"):
        session.experiences(1.0, mode="concat")
    steps = session.experiences(1.0, mode="step")
    assert [e.info["choice"] for e in steps[-2:]] == [0, 1]
    assert [e.tokens.tolist()[e.prompt_length :] for e in steps[-2:]] == [c.token_ids for c in many.choices]
    assert json.dumps([e.info for e in steps])  # info stays JSON-safe for the buffer
