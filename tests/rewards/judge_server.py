"""A deterministic judge behind a real OpenAI-compatible HTTP server on 127.0.0.1 (FastAPI run by uvicorn),
for the judged rewards' tests and the end-to-end run whose only reward is a judge."""

import re
import socket
import threading
import time
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, Header, HTTPException

KEY = "sk-test-judge"


class Judge:
    """A deterministic judge: 'Score: 1' for answers containing 'good', '0' otherwise, 'hmm' for 'vague'
    (unparsable); yes/no for rubric criteria that are words the answer contains; for a ruler prompt, 1 / 0.5 /
    0 per answer with 'good' / 'ok' / neither, and no scores at all when an answer is 'vague'."""

    def __init__(self, delay: float = 0.05, strict: bool = False):
        self.strict = strict  # rubric: "yes" only for an answer that is exactly the criterion
        self.calls, self.in_flight, self.peak = [], 0, 0
        self.max_tokens: list[int | None] = []  # what each call asked for
        self.lock = threading.Lock()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        def chat(body: dict, authorization: str = Header("")):
            if authorization != f"Bearer {KEY}":
                raise HTTPException(401, "bad key")
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            time.sleep(delay)  # long enough for concurrent calls to overlap
            prompt = body["messages"][-1]["content"]
            with self.lock:
                self.in_flight -= 1
                self.calls.append(prompt)
                self.max_tokens.append(body.get("max_tokens"))
            message = {"role": "assistant", "content": self.reply(prompt)}
            return {
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }  # fmt: skip

        self.app = app

    def reply(self, prompt: str) -> str:
        if "candidate answers" in prompt:  # ruler: every answer of the group scored in one reply
            answers = re.findall(r"Answer \d+:\n(.*)\n", prompt)
            if any("vague" in a for a in answers):
                return "they all look fine"
            return "\n".join(
                f"{i}: {1.0 if 'good' in a else 0.5 if 'ok' in a else 0.0}" for i, a in enumerate(answers, 1)
            )
        answer = re.search(r"Answer: (.*?)\n(?:Does the answer|Reply with)", prompt, re.S).group(1)
        if "criterion: " in prompt:
            word = prompt.split("criterion: ")[1].split("\n")[0]
            return "yes" if (answer.strip() == word if self.strict else word in answer) else "no"
        return "hmm, hard to say" if "vague" in answer else f"Score: {int('good' in answer)}"


@contextmanager
def serving(judge: Judge):
    """``judge`` served on a free port of 127.0.0.1; ``judge.url`` is its ``.../v1`` base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(judge.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    judge.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield judge
    finally:
        server.should_exit = True
        thread.join(10)
