"""Fuzzed request bodies against a real uvicorn server on 127.0.0.1 over a tiny model: every answer is a 2xx
or a 4xx whose error names the field (or the body), never a 5xx, and the server stays up."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.fuzz.fuzz_helpers import NASTY_NUMBERS, NASTY_STRINGS, both_suites, fuzz_settings, json_values

from trivium.serve.limits import ServeLimits
from trivium.serve.openai_server import OpenAIServer
from trivium.serve.recorder import Recorder

LIMITS = ServeLimits(max_body_bytes=256 << 10, max_n=4, split_n=2, max_tokens=4)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    from trivium.models.transformers_engine import TransformersEngine

    engine = TransformersEngine.from_pretrained(tiny_model_dir, seed=0)
    with OpenAIServer(engine, model_name="tiny", recorder=Recorder(), limits=LIMITS) as srv:
        yield srv


def anything():
    return st.one_of(json_values(6), st.sampled_from(NASTY_NUMBERS), st.sampled_from(NASTY_STRINGS))


def messages():
    message = st.fixed_dictionaries(
        {
            "role": st.one_of(
                st.sampled_from(["system", "developer", "user", "assistant", "tool"]), anything()
            ),
            "content": st.one_of(st.text(max_size=40), st.sampled_from(NASTY_STRINGS), anything()),
        },
        optional={"name": anything(), "tool_calls": anything(), "tool_call_id": anything()},
    )
    return st.one_of(st.lists(message, min_size=1, max_size=4), anything())


FIELDS = {
    "n": st.one_of(st.integers(-2, 6), anything()),
    "temperature": st.one_of(st.floats(-1, 3, allow_nan=False, allow_subnormal=False), anything()),
    "top_p": st.one_of(st.floats(0, 1.5, allow_nan=False, allow_subnormal=False), anything()),
    "top_k": st.one_of(st.integers(-1, 10**6), anything()),
    "max_tokens": st.one_of(st.integers(-1, 10**6), anything()),
    "max_completion_tokens": anything(),
    "stop": st.one_of(st.lists(st.text(max_size=5), max_size=20), anything()),
    "seed": st.one_of(st.integers(-(2**64), 2**65), anything()),
    "stream": anything(),
    "logprobs": anything(),
    "top_logprobs": anything(),
    "response_format": st.one_of(st.sampled_from([{"type": "text"}, {"type": "json_object"}]), anything()),
    "tools": anything(),
    "tool_choice": anything(),
    "presence_penalty": anything(),
    "logit_bias": anything(),
    "user": anything(),
}


@st.composite
def bodies(draw):
    """``(route, bytes)``: mostly near-valid JSON requests, some raw bytes."""
    route = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    if draw(st.integers(0, 9)) == 0:
        return route, draw(st.binary(max_size=200))
    body = (
        {"messages": draw(messages())}
        if "chat" in route
        else {
            "prompt": draw(
                st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 400), max_size=8), anything())
            )
        }
    )
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        body[name] = draw(FIELDS[name])
    body.setdefault("max_tokens", 4)
    return route, json.dumps(body, allow_nan=True).encode()


class Client:
    """A keep-alive HTTP connection that reconnects when the server closes it (after 408/413)."""

    def __init__(self, port: int):
        self.port, self.conn = port, None

    def post(self, route: str, data: bytes) -> tuple[int, str, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request("POST", route, body=data, headers={"Content-Type": "application/json"})
                reply = self.conn.getresponse()
                payload = reply.read()
                if reply.getheader("connection", "").lower() == "close":
                    self.close()
                return reply.status, reply.getheader("content-type", ""), payload
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def check(status: int, kind: str, payload: bytes) -> None:
    assert status < 500, payload[:2000]
    if status < 300:
        if kind.startswith("text/event-stream"):
            assert payload.rstrip().endswith(b"data: [DONE]")
        else:
            assert json.loads(payload)["choices"]
        return
    error = json.loads(payload)["error"]
    message = error["message"]
    assert message and len(message) < 5000
    named = error["param"] or any(w in message for w in ("JSON", "request body", "Authorization"))
    assert named, error


@both_suites(fast=250, slow=1500)
def test_fuzzed_request_bodies(server, examples):
    client = Client(server.port)

    @fuzz_settings(examples, derandomize=examples < 1000)
    @given(bodies())
    def run(request):
        route, data = request
        check(*client.post(route, data))

    try:
        run()
        status, _, payload = client.post(
            "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}'
        )
        assert status == 200, payload  # still serving
    finally:
        client.close()
