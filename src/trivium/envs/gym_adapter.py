"""Any gymnasium environment as a text environment: ``GymnasiumEnv``.

Two pieces of text glue make a gymnasium env playable by a language model: ``describe(observation,
info) -> str`` renders what the agent sees, and ``parse_action(text) -> action | None`` reads the model's
turn (None: no valid action in it). A subclass overrides them, or the constructor takes them as
callables. For ``Discrete`` spaces both have defaults (the observation printed as is, the last integer in
the turn as the action), so ``env: trivium.envs.gym_adapter.GymnasiumEnv`` with
``env_args: {env_id: Taxi-v4}`` runs without code.

Design decisions:
- The gym env is made in ``reset``, not in the constructor: its make arguments may come from the task row
  (FrozenLake's map does), via ``task_make_kwargs(task)``. ``gymnasium`` is imported there too, so the
  built-in environments register without it and only a gym-backed episode needs it installed.
- Seeding: ``env.reset(seed=...)`` gets the row's ``seed`` field, else a stable hash of the task id. Every
  sample of a task (a GRPO group) then starts from the same state, and a slippery env slips the same way
  for the same actions, so samples differ only by what the policy did.
- An invalid turn does not touch the gym env: the reply names the valid actions (``action_help``) and
  shows the unchanged observation; it earns ``invalid_action_reward`` and counts toward ``max_steps``,
  so a model that never answers properly still ends its episode.
- ``max_steps`` is also passed as gymnasium's ``max_episode_steps`` (unless ``make_kwargs`` sets it), so
  the registered TimeLimit (100 for FrozenLake 4x4) never cuts an episode shorter than asked.
- ``info`` carries numbers only (they become metrics): ``steps``, ``invalid_actions``, ``return`` (sum
  of rewards so far) and ``success`` (1.0 when ``is_success``: by default terminated with a positive
  reward, which fits FrozenLake and Taxi; CliffWalking's goal gives -1 and needs its own rule).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from trivium.envs.base import Environment, Message, StepResult
from trivium.types import Task

__all__ = ["GymnasiumEnv", "task_seed"]

_INTEGER = re.compile(r"[-+]?\d+")


def task_seed(task: Task, field: str = "seed") -> int:
    """The row's ``field`` (an int) if it has one, else a stable 31-bit hash of the task id."""
    value = task.data.get(field)
    if value is None:
        return zlib.crc32(task.task_id.encode("utf-8")) & 0x7FFFFFFF
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"task {task.task_id!r}: field '{field}' must be an integer seed, got {type(value).__name__} "
            f"{value!r}; write an int or drop the field (the task id then seeds the episode)"
        )
    return value


class GymnasiumEnv(Environment):
    """A gymnasium env played through text; one instance is one episode (see the module docstring).

    Args:
        env_id: a registered gymnasium id, e.g. ``"FrozenLake-v1"``.
        make_kwargs: keyword arguments for ``gymnasium.make`` (``task_make_kwargs`` may add per-task ones).
        max_steps: turns before the episode ends, invalid turns included.
        invalid_action_reward: reward of a turn without a valid action.
        describe, parse_action, is_success: callables replacing the methods of the same names.
        action_help: the sentence that tells the model what a valid action is.
        instruction: text put before the first observation (rules, legend, answer format).
        seed_field: the task row field that seeds ``env.reset``.
    """

    def __init__(
        self,
        env_id: str,
        make_kwargs: Mapping[str, Any] | None = None,
        max_steps: int = 50,
        invalid_action_reward: float = 0.0,
        describe: Callable[[Any, Mapping[str, Any]], str] | None = None,
        parse_action: Callable[[str], Any | None] | None = None,
        is_success: Callable[[float, bool, Mapping[str, Any]], bool] | None = None,
        action_help: str | None = None,
        instruction: str | None = None,
        seed_field: str = "seed",
    ):
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"env_id must be a registered gymnasium id such as 'Taxi-v4', got {env_id!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        self.env_id = env_id
        self.make_kwargs = dict(make_kwargs or {})
        self.max_steps = max_steps
        self.invalid_action_reward = float(invalid_action_reward)
        self._describe_fn, self._parse_fn, self._success_fn = describe, parse_action, is_success
        self._action_help = action_help
        self.instruction = instruction
        self.seed_field = seed_field
        self.env: Any = None  # the gymnasium env, made by reset
        self._obs: Any = None
        self._info: Mapping[str, Any] = {}
        self.steps = self.invalid_actions = 0
        self.total_reward, self.success, self.done = 0.0, False, False

    # --- text glue: override these, or pass callables -------------------------------------------------
    def describe(self, observation: Any, info: Mapping[str, Any]) -> str | list[dict[str, Any]]:
        """The observation for the model: text, or a list of content parts (text and image parts, see
        ``envs/base.py``) for a vision-language model. Default: the value printed as is."""
        if self._describe_fn is not None:
            return self._describe_fn(observation, info)
        value = observation.tolist() if hasattr(observation, "tolist") else observation
        return f"Observation: {value}"

    def parse_action(self, text: str) -> Any | None:
        """The gym action in the model's turn, or None. Default (Discrete spaces): the last integer in range."""
        if self._parse_fn is not None:
            return self._parse_fn(text)
        start, n = self._discrete_actions()
        for match in reversed(_INTEGER.findall(text)):
            if start <= int(match) < start + n:
                return int(match)
        return None

    def action_help(self) -> str:
        """One sentence naming the valid actions (sent after an invalid turn)."""
        if self._action_help is not None:
            return self._action_help
        start, n = self._discrete_actions()
        return f"Answer with an action number from {start} to {start + n - 1}."

    def is_success(self, reward: float, terminated: bool, info: Mapping[str, Any]) -> bool:
        """Whether the step that ended the episode reached the goal. Default: terminated with reward > 0."""
        if self._success_fn is not None:
            return bool(self._success_fn(reward, terminated, info))
        return terminated and reward > 0

    def task_make_kwargs(self, task: Task) -> dict[str, Any]:
        """``gymnasium.make`` arguments for this task; default: the constructor's ``make_kwargs``."""
        return dict(self.make_kwargs)

    # --- the Environment contract ---------------------------------------------------------------------
    def reset(self, task: Task) -> str | list[Message]:
        try:
            import gymnasium
        except ImportError as exc:
            raise ImportError(
                f"environment '{self.name or type(self).__name__}' runs the gymnasium env {self.env_id!r} "
                "and needs gymnasium: pip install 'gymnasium>=1.0'"
            ) from exc
        self.close()
        kwargs = self.task_make_kwargs(task)
        kwargs.setdefault("max_episode_steps", self.max_steps)
        self.env = gymnasium.make(self.env_id, **kwargs)
        self._obs, self._info = self.env.reset(seed=task_seed(task, self.seed_field))
        self.steps = self.invalid_actions = 0
        self.total_reward, self.success, self.done = 0.0, False, False
        return _observation(self.instruction, self.describe(self._obs, self._info))

    def step(self, action: str) -> StepResult:
        if self.done or self.env is None:
            raise RuntimeError(
                f"{type(self).__name__}.step() called "
                f"{'after the episode ended' if self.done else 'before reset()'}; "
                "environments are made fresh for every episode"
            )
        self.steps += 1
        move = self.parse_action(action)
        if move is None:
            self.invalid_actions += 1
            reward, terminated, truncated = self.invalid_action_reward, False, False
            text = _observation(
                f"Invalid action. {self.action_help()}", self.describe(self._obs, self._info), "\n"
            )
        else:
            self._obs, gym_reward, terminated, truncated, self._info = self.env.step(move)
            reward = float(gym_reward)
            text = _observation(None, self.describe(self._obs, self._info))
            if terminated or truncated:
                self.success = self.is_success(reward, bool(terminated), self._info)
        self.total_reward += reward
        self.done = bool(terminated or truncated or self.steps >= self.max_steps)
        return StepResult(observation=text, reward=reward, done=self.done, info=self._step_info())

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def _step_info(self) -> dict[str, float]:
        return {
            "steps": float(self.steps),
            "invalid_actions": float(self.invalid_actions),
            "return": self.total_reward,
            "success": float(self.success),
        }

    def _discrete_actions(self) -> tuple[int, int]:
        space = self.env.action_space if self.env is not None else None
        n = getattr(space, "n", None)
        if n is None:
            raise TypeError(
                f"{type(self).__name__} ({self.env_id}): the default action parser handles Discrete action "
                f"spaces only, this one is {space}; subclass GymnasiumEnv or pass parse_action= and action_help="
            )
        return int(getattr(space, "start", 0)), int(n)


def _observation(
    before: str | None, described: str | list[dict[str, Any]], sep: str = "\n\n"
) -> str | list[Message]:
    """``described`` (text or content parts) with ``before`` put in front of it: text stays text, parts
    become one user message whose parts start with ``before``."""
    if isinstance(described, str):
        return f"{before}{sep}{described}" if before else described
    parts = ([{"type": "text", "text": before + sep}] if before else []) + list(described)
    return [{"role": "user", "content": parts}]
