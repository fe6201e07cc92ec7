"""The environment contract for multi-turn workflows: text in, text out.

An environment is made fresh for every episode (one run of a task). ``reset(task)`` returns the opening
messages (the conversation the model sees first); ``step(action)`` takes the text of the model's turn and
returns what the environment says back, a reward for that step and whether the episode is over.

Observations are chat messages (``{"role": "user" | "tool" | "system", "content": str}``), not tokens:
the workflow renders them with the model's chat template and appends their tokens to the transcript with
action mask False. A plain string is one user message.

Image observations (vision-language models): a message's ``content`` may be a list of parts, text parts
``{"type": "text", "text": str}`` and image parts ``{"type": "image", "image": X}`` where ``X`` is a PIL
image, a uint8 array ``[H, W, 3]``, encoded bytes, a ``data:image/...;base64`` URL or a file path
(``image_part`` makes one). The workflow checks and stores each image once (the run's image store) and
the experiences refer to it; a bad image fails that episode only, naming the call, message and part. With
a text-only rollout model an image observation fails the episode with an error that says so.

Rewards: ``StepResult.reward`` is the reward of that step. Environments with only a final reward return 0
until the last step. The episode return is the sum over steps.

Reflect and retry (``workflow: reflect_retry``): an environment may say where a failed episode went wrong,
``diagnose(actions) -> Diagnosis | None``, called on the finished episode's environment with the text of
each model turn. The workflow replays the turns before ``Diagnosis.turn`` in a fresh environment (so
``reset`` and ``step`` must be deterministic for a task) and samples that turn anew, avoiding the turn texts
that ``Diagnosis.repeats`` flags. The default says nothing (no episode is retried).

Robustness: workflows call ``reset`` and ``step`` with a timeout (``env_timeout_s``); an environment that
raises or hangs fails that episode only, recorded with the task id and the reason. A call that overruns
is told to stop and ``close()`` is called at once (``envs/calls.py`` says what Python cannot interrupt).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trivium.registry import Registry, subclass_of
from trivium.types import Task

__all__ = [
    "ENVIRONMENTS",
    "Diagnosis",
    "Environment",
    "Message",
    "StepResult",
    "as_messages",
    "get_env_class",
    "image_part",
    "make_env",
    "register_env",
]

Message = Mapping[str, Any]


@dataclass(frozen=True)
class StepResult:
    observation: str | Sequence[Message] = ()  # what the environment says back (ignored when done)
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)  # JSON-safe; numeric entries become metrics


@dataclass(frozen=True)
class Diagnosis:
    """Where a failed episode went wrong (``Environment.diagnose``): what ``reflect_retry`` restarts from."""

    turn: int  # the model turn (0-based) that made the mistake: the retry keeps the turns before it
    feedback: str = ""  # the mistake in words (kept in the retry's experiences, shown by Studio and debug)
    # True for a turn text that makes the same mistake again: the retry's first turn is never one of those
    # (None: never the failed turn's text again)
    repeats: Callable[[str], bool] | None = None


class Environment(ABC):
    """One episode's environment. Subclasses take their ``env_args`` as keyword arguments.

    The constructor must be cheap and free of side effects (check its arguments, store them): one is made
    per episode, and ``trivium check-config`` makes one to check ``env_args``. Start processes, open
    connections or build simulators in ``reset``.
    """

    name: str = ""
    #: Task row fields this environment needs (name -> allowed types), checked when the task set loads.
    fields: Mapping[str, tuple[type, ...]] = {}

    @abstractmethod
    def reset(self, task: Task) -> str | Sequence[Message]:
        """Start the episode for ``task``; the opening messages (a string is one user message)."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply the model's turn (its text) and report what happened."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (processes, files); called once the episode ends, also after errors, and right
        after a ``reset`` or ``step`` that overran ``env_timeout_s`` (while it may still run in its thread):
        kill the process or close the socket such a call waits on, so that it ends too."""

    def diagnose(self, actions: Sequence[str]) -> Diagnosis | None:
        """Where the episode just played went wrong, given each model turn's text (``actions[k]`` is turn
        k); None: no diagnosis (the episode is not retried). Called after the episode ended and
        ``close()`` ran, so it reads what ``reset``/``step`` recorded, not a live simulator."""
        return None

    #: Tools the model may call (OpenAI ``tools`` schema entries); rendered by the chat template.
    def tool_schemas(self) -> list[dict[str, Any]]:
        return []


def image_part(image: Any) -> dict[str, Any]:
    """An image content part of an observation message (see the module docstring for what ``image`` may be)."""
    return {"type": "image", "image": image}


def as_messages(observation: str | Sequence[Message]) -> list[dict[str, Any]]:
    """An observation as a list of chat messages (a plain string is one user message)."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    out = [dict(m) for m in observation]
    for k, m in enumerate(out):
        if "role" not in m or "content" not in m:
            raise ValueError(f"observation message {k} must have 'role' and 'content', got keys {sorted(m)}")
    return out


ENVIRONMENTS: Registry[type[Environment]] = Registry(
    "environment",
    doc="an Environment subclass: Class(**env_args) with reset(task) and step(text)",
    check=subclass_of(Environment),
    builtins=[
        "trivium.envs.ask_user",
        "trivium.envs.frozenlake",
        "trivium.envs.tool_env",
    ],  # (frozenlake imports gymnasium)
)


def register_env(name: str):
    """Class decorator: register an ``Environment`` subclass under ``name`` (also its ``name`` attribute)."""

    def deco(cls: type[Environment]) -> type[Environment]:
        cls.name = name
        return ENVIRONMENTS.register(name)(cls)

    return deco


def get_env_class(name: str) -> type[Environment]:
    """The environment called ``name``: registered (built-ins included) or ``module:Class``."""
    return ENVIRONMENTS.get(name)


def make_env(name: str, **env_args: Any) -> Environment:
    return get_env_class(name)(**env_args)
