"""Record every call an agent makes through the endpoint, per agent run, as token ids and log-probs.

An agent written against the OpenAI API (any framework, any number of model calls) becomes a source of
training data: give each run its own ``RecordingSession`` (``recorder.session()``), point the agent at
``session.client()`` (or at ``session.base_url``), and afterwards turn ``session.calls`` into experiences
with ``session.experiences(reward)``.

Design decisions:
- Routing by URL, not by header or model name: the server serves ``/sessions/{session_id}/v1/...``, so a
  session is just a base URL that any OpenAI client accepts, and concurrent agents never mix. Plain
  ``/v1/...`` goes to the recorder's default session (``default_session="default"``) or is served without
  being recorded (``default_session=None``). A request to an unknown or closed session is refused (404)
  rather than silently creating one, so a mistyped URL cannot scatter an agent's calls.
- Token-in/token-out for chat: an agent sends the whole history back on every call. When a request's
  messages are an earlier call's request messages, then the assistant message that call returned (same
  content and tool calls, in the normal form of ``ChatMessage.template``), then new messages, its prompt
  continues that call's ``Transcript`` (the sampled ids, then the template's tokens for the new messages)
  instead of re-rendering text, so the sampled tokens reach the next prompt byte for byte. Re-rendering
  can tokenise a reply differently from how it was sampled (BPE merges across the turn boundary, text cut
  at a stop string, a truncated turn); the trainer would then score tokens the model never produced.
  Otherwise (first call, edited history, different tools, a template that is not prefix-stable) the
  messages are rendered afresh. ``RecordedCall.prefix_reused`` says which path was taken.
- ``experiences(mode="concat")`` merges a session into one sequence only when every call's prompt starts
  with the previous call's prompt and response ids; otherwise it raises, naming the call and the token
  where they differ. It does not fall back to ``"step"``: one episode sequence and one sequence per turn
  are different training signals (credit assignment, length normalisation), and which one a run trains
  on should not depend on whether an agent happened to edit its history.
- ``on_call`` (e.g. a write to a SQL buffer) runs in the request's thread before the call is added to the
  session; if it raises, the request fails (500) and the call is not recorded, so a stored session never
  holds a call its agent did not receive, and no call is lost silently.

Left out on purpose: eviction (``session.close()`` releases a session's transcripts; the caller owns
its lifetime) and persistence (``on_call``).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from trivium.models.chat import TemplateError
from trivium.models.protocol import Generation
from trivium.models.transcript import Transcript
from trivium.serve.experiences import RecordedCall, RecordedChoice, concat_experience, step_experiences
from trivium.types import Experience

__all__ = ["ChatPrompt", "RecordedCall", "RecordedChoice", "Recorder", "RecordingSession", "render_chat"]

_SESSION_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass
class ChatPrompt:
    """A chat request's prompt ids and the transcript they came from (kept to continue it later)."""

    ids: list[int]
    transcript: Transcript
    prefix_reused: bool = False
    continued_call_id: str | None = None


def render_chat(
    tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    eos_ids=(),
    vision=None,
) -> ChatPrompt:
    """The prompt of ``messages`` rendered afresh by the chat template (with the generation prompt);
    ``vision``: the image processor that widens image parts (a vision-language model)."""
    transcript = Transcript(tokenizer, messages, tools=tools, eos_ids=eos_ids, vision=vision)
    return ChatPrompt(transcript.ids, transcript)


class RecordingSession:
    """The calls of one agent run; made by ``Recorder.session``. Thread-safe."""

    def __init__(self, recorder: Recorder, session_id: str, metadata: Mapping[str, Any] | None):
        self.recorder = recorder
        self.session_id = session_id
        self.metadata = dict(metadata or {})
        self.closed = False
        self._lock = threading.Lock()
        self._calls: list[RecordedCall] = []
        self._chat: dict[str, tuple[Transcript, tuple[Generation, ...]]] = {}  # call id -> prompt, replies

    # ------------------------------------------------------------------------------------ agent side
    @property
    def calls(self) -> list[RecordedCall]:
        """The recorded calls, in the order their responses were produced."""
        with self._lock:
            return list(self._calls)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of this session (``.../sessions/{id}/v1``); needs a started server."""
        if self.recorder.url is None:
            raise RuntimeError(
                f"session {self.session_id!r} has no URL yet: start an OpenAIServer with this recorder "
                "(or call recorder.bind(url) when serving create_app() yourself)"
            )
        return f"{self.recorder.url}/sessions/{self.session_id}/v1"

    def client(self, **kwargs: Any):
        """An ``openai.OpenAI`` bound to this session. Retries are off by default (``max_retries=0``): a
        retried request whose first attempt did reach the engine would record a call twice."""
        import openai

        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.base_url, api_key=self.recorder.api_key or "EMPTY", **kwargs)

    def async_client(self, **kwargs: Any):
        """An ``openai.AsyncOpenAI`` bound to this session (``max_retries=0`` as in ``client``)."""
        import openai

        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.recorder.api_key or "EMPTY", **kwargs)

    def experiences(
        self,
        reward: float,
        mode: Literal["step", "concat"] = "step",
        *,
        task_id: str = "",
        run_index: int = 0,
    ) -> list[Experience]:
        """The session's calls as experiences, all with ``reward``.

        ``"step"``: one experience per reply of every call (prompt, then the sampled ids; ``turn`` is the
        call's position). ``"concat"``: one experience for the whole session (see the module docstring);
        needs ``n == 1`` calls that continue each other. ``info`` holds ``session_id``, ``call_ids`` and
        ``texts``; ``metrics`` hold ``num_calls`` and ``response_length``.
        """
        calls = self.calls
        if not calls:
            raise ValueError(f"session {self.session_id!r} has no recorded calls: nothing to train on")
        common = {"reward": float(reward), "task_id": task_id, "run_index": run_index}
        if mode == "step":
            return step_experiences(self.session_id, calls, **common)
        if mode == "concat":
            return [concat_experience(self.session_id, calls, **common)]
        raise ValueError(f"experiences(mode={mode!r}): mode must be 'step' or 'concat'")

    def close(self) -> None:
        """Stop routing requests here (they get 404) and release the transcripts; ``calls`` stay."""
        self.recorder._forget(self.session_id)
        with self._lock:
            self.closed = True
            self._chat.clear()

    def __enter__(self) -> RecordingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ server side
    def prepare_chat(
        self,
        tokenizer,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        eos_ids=(),
        vision=None,
    ) -> ChatPrompt:
        """The prompt of a chat request: continues an earlier call's transcript when the messages extend
        it (see the module docstring), otherwise rendered afresh."""
        messages = [dict(m) for m in messages]
        found = self._continuation(messages, tools)
        if found is not None:
            call, transcript, gen, message = found
            try:
                forked = transcript.fork()
                forked.add_generation(gen, message)
                forked.add_messages(messages[len(call.messages) + 1 :])
                return ChatPrompt(forked.ids, forked, prefix_reused=True, continued_call_id=call.call_id)
            except TemplateError:
                pass  # not prefix-stable for these messages: render afresh (prefix_reused stays False)
        return render_chat(tokenizer, messages, tools, eos_ids, vision)

    def record(
        self,
        call: RecordedCall,
        generations: Sequence[Generation] = (),
        prompt: ChatPrompt | None = None,
    ) -> None:
        """Add ``call`` (after the recorder's ``on_call`` hook); chat calls keep their transcript so that a
        later request can continue it."""
        hook = self.recorder.on_call
        if hook is not None:
            hook(call)
        with self._lock:
            self._calls.append(call)
            if prompt is not None and not self.closed:
                self._chat[call.call_id] = (prompt.transcript, tuple(generations))

    def _continuation(
        self, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[RecordedCall, Transcript, Generation, Mapping[str, Any]] | None:
        """The earlier chat call with the longest history that ``messages`` extend, and the reply taken."""
        tools_key = tuple(tools) if tools else None
        best = None
        with self._lock:
            for call in reversed(self._calls):
                if call.kind != "chat" or call.call_id not in self._chat or call.tools != tools_key:
                    continue
                k = len(call.messages or ())
                if len(messages) < k + 2 or (best is not None and k <= len(best[0].messages)):
                    continue
                if messages[:k] != [dict(m) for m in call.messages or ()]:
                    continue
                for choice in call.choices:
                    # Frameworks add a speaker `name` to the reply they send back; it is not the model's.
                    if _without_name(choice.message) == _without_name(messages[k]):
                        transcript, generations = self._chat[call.call_id]
                        best = (call, transcript, generations[choice.index], choice.message)
                        break
        return best


class Recorder:
    """Sessions by id; the server asks it where each request goes. ``on_call(call)`` sees every call."""

    def __init__(
        self,
        *,
        on_call: Callable[[RecordedCall], None] | None = None,
        default_session: str | None = "default",
    ):
        self.on_call = on_call
        self.url: str | None = None  # set by bind() (the server's root URL)
        self.api_key: str | None = None
        self._lock = threading.Lock()
        self._sessions: dict[str, RecordingSession] = {}
        self.default_session_id = default_session
        self.default: RecordingSession | None = None
        if default_session is not None:
            self.default = self.session(default_session, {"default": True})

    def bind(self, url: str, api_key: str | None = None) -> None:
        """Tell the recorder where its server listens (``OpenAIServer.start`` does this)."""
        self.url, self.api_key = url.rstrip("/"), api_key

    def session(
        self, session_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> RecordingSession:
        """A new session (id: a random hex string unless given; ``[A-Za-z0-9_.-]``, unique)."""
        session_id = session_id if session_id is not None else uuid.uuid4().hex
        if not _SESSION_ID.fullmatch(session_id):
            raise ValueError(
                f"session id {session_id!r} must be 1-128 characters of [A-Za-z0-9_.-] (it is a URL part)"
            )
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} already exists; pick another id or omit it")
            created = RecordingSession(self, session_id, metadata)
            self._sessions[session_id] = created
        return created

    def get(self, session_id: str | None) -> RecordingSession | None:
        """The session for a request: by id, or the default session (None when recording is off).

        Raises ``LookupError`` for an unknown or closed session id.
        """
        if session_id is None:
            return self.default if self.default is not None and not self.default.closed else None
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None:
            raise LookupError(
                f"session {session_id!r} does not exist or was closed; create it with recorder.session() and "
                "use session.base_url"
            )
        return found

    @property
    def sessions(self) -> dict[str, RecordingSession]:
        with self._lock:
            return dict(self._sessions)

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)


def _without_name(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "name"}


def new_call_id(kind: Literal["chat", "completion"]) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
