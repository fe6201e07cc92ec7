"""Multi-turn workflows over an environment: the model and the environment take turns until it is done.

Two ways to turn an episode into experiences (both token-in, token-out through ``Transcript``):

- ``multi_turn`` (concatenated): one experience per episode. The whole conversation is the response;
  model tokens have action mask True, environment tokens False. Reward: the episode return (sum of step
  rewards). Works with every advantage function (GRPO groups the task's episodes).
- ``step_wise`` (general): one experience per model turn. Its prompt is the conversation so far, its
  response that turn's tokens. Reward: the return from that turn on, Σ_{t'≥t} γ^{t'−t} r_{t'} (the episode
  reward on every turn when the environment rewards only the end). ``Experience.run_index`` is the
  episode, ``Experience.turn`` the turn, ``info["state"]`` a digest of the observation the turn answered
  (``state_key``); the ``step_wise_grpo`` advantage compares episodes of a task, ``gigpo`` also the turns
  taken from one state.
  Use it when episodes outgrow the context, or when the context is rewritten between turns.

The ``repeat_times`` episodes of a task step together: each round samples one turn for every live
episode in a single model call, then steps every environment.

Failures: environments are stepped in a helper thread with a timeout (``env_timeout_s``, see
``envs/calls.py``: an overrunning call is told to stop, then the environment is closed); an environment
that raises or hangs fails its own episode (dropped, logged with task id, run and reason, and listed in
``failed_runs`` for the explorer to record); the other episodes of the task go on. Only when every episode
fails does the task fail. ``max_turns`` bounds an episode; an episode that would outgrow the model's
context ends there (``reason: context``) and keeps the rewards it earned.

The chat template must be prefix-stable (``trivium check-template``); a template that is not would give
the model, in training, contexts it never sees at inference, so these workflows refuse it unless
``allow_unstable_template`` is set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from trivium.envs.base import Environment, StepResult, as_messages, get_env_class
from trivium.envs.calls import EnvTimeoutError, call_with_timeout
from trivium.models.chat import TemplateError
from trivium.models.handle import ModelHandle
from trivium.models.protocol import Generation
from trivium.models.transcript import Transcript, check_template
from trivium.types import Experience, Task, version_runs
from trivium.workflows.base import Workflow
from trivium.workflows.registry import register_workflow

log = logging.getLogger(__name__)

__all__ = ["EnvTimeoutError", "MultiTurnWorkflow", "ReActWorkflow", "StepWiseWorkflow", "call_with_timeout"]


_TEMPLATE_CHECKS: dict[int, Any] = {}  # id(tokenizer) -> TemplateReport
_TEMPLATE_LOCK = threading.Lock()


def require_stable_template(tokenizer, allow_unstable: bool) -> None:
    with _TEMPLATE_LOCK:
        report = _TEMPLATE_CHECKS.get(id(tokenizer))
        if report is None:
            report = _TEMPLATE_CHECKS[id(tokenizer)] = check_template(tokenizer)
    if not report.stable and not allow_unstable:
        raise TemplateError(
            f"{report}\nMulti-turn training on this template would teach the model contexts it never sees at "
            "inference. Fix the template (keep earlier turns as they were rendered) or set "
            "workflow_args.allow_unstable_template: true to proceed anyway."
        )


@dataclass
class Episode:
    run_index: int
    env: Environment
    transcript: Transcript | None = None
    rewards: list[float] = field(default_factory=list)  # one per model turn
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn
    turn_images: list[int] = field(default_factory=list)  # images in the transcript at each model turn
    state: str = ""  # digest of the latest observation (``state_key``): the state the next turn starts from
    turn_states: list[str] = field(default_factory=list)  # ``state`` at each model turn
    last: StepResult | None = None
    done: bool = False
    reason: str = ""  # why it ended: done, max_turns, context, error
    error: str = ""
    # the model turns' Generations, kept only by workflows that replay episodes (``keeps_generations``)
    generations: list[Generation] = field(default_factory=list)
    first_turn: int = 0  # step_wise: turns before it give no experience (reflect_retry's pivotal credit)
    info: dict[str, Any] = field(default_factory=dict)  # added to the info of the episode's experiences
    metrics: dict[str, float] = field(default_factory=dict)  # added to their metrics


class MultiTurnWorkflow(Workflow):
    """Concatenated multi-turn episodes with an environment; see the module docstring.

    Args (``workflow_args``): ``env`` (registered name or ``module:Class``), ``env_args`` (keyword arguments of
    the environment), ``max_turns`` (model turns per episode), ``env_timeout_s`` (per reset/step, 0 = no
    limit), ``allow_unstable_template``.
    """

    default_env: ClassVar[str | None] = None
    reads_all_columns: ClassVar[bool] = True  # the environment reads what it needs from the task row
    keeps_generations: ClassVar[bool] = False  # keep each turn's Generation in ``Episode.generations``

    def __init__(
        self,
        env: str | None = None,
        env_args: Mapping[str, Any] | None = None,
        max_turns: int = 8,
        env_timeout_s: float = 30.0,
        allow_unstable_template: bool = False,
    ):
        env = env or self.default_env
        if not env:
            raise ValueError(f"workflow '{self.name}' needs workflow_args.env (an environment name)")
        if max_turns < 1:
            raise ValueError(f"workflow_args.max_turns={max_turns} must be >= 1")
        self.env_name = env
        self.env_class = get_env_class(env)  # an unknown name fails here (and in check-config)
        self.env_args = dict(env_args or {})
        self.max_turns = max_turns
        self.env_timeout_s = env_timeout_s
        self.allow_unstable_template = allow_unstable_template
        self.failed_runs: list[tuple[int, str]] = []  # (run_index, reason), read by the explorer

    def make_env(self) -> Environment:
        return self.env_class(**self.env_args)

    # ----------------------------------------------------------------------------------------- episodes
    def run(self, task: Task, model: ModelHandle) -> list[Experience]:
        require_stable_template(model.tokenizer, self.allow_unstable_template)
        episodes = [self._start(task, model, i) for i in range(model.params.n)]
        self._play(task, model, episodes)
        return [x for e in self._finished(task, episodes) for x in self.experiences(task, e)]

    def _play(self, task: Task, model: ModelHandle, episodes: list[Episode]) -> None:
        """Step the live ``episodes`` together until each is done: one model call a round for all of them."""
        while live := [e for e in episodes if not e.done]:
            room = model.max_length
            for e in live:
                if room is not None and len(e.transcript.tokens) + 2 > room:
                    e.done, e.reason = True, "context"
            live = [e for e in live if not e.done]
            if not live:
                break
            media = [prompt_images(e.transcript) for e in live]
            generations = model.generate_many(
                [e.transcript.ids for e in live], media=media if any(media) else None, n=1
            )
            for e, (gen,) in zip(live, generations):
                self._take_turn(task, e, gen, model)

    def _take_turn(self, task: Task, e: Episode, gen: Generation, model: ModelHandle) -> None:
        """Add the model's turn ``gen`` to the episode and step its environment with the turn's text."""
        start = len(e.transcript.tokens)
        e.turn_images.append(len(e.transcript.images))
        e.turn_states.append(e.state)
        e.transcript.add_generation(gen)
        e.turn_spans.append((start, len(e.transcript.tokens)))
        if self.keeps_generations:
            e.generations.append(gen)
        self._step(task, e, gen.text, model)

    def _finished(self, task: Task, episodes: list[Episode]) -> list[Episode]:
        """The episodes that did not fail (failures logged and kept in ``failed_runs``); raises if none."""
        self.failed_runs = [(e.run_index, e.error) for e in episodes if e.reason == "error"]
        for run, reason in self.failed_runs:
            log.warning("task %s run %d failed: %s", task.task_id, run, reason)
        ok = [e for e in episodes if e.reason != "error"]
        if not ok:
            raise RuntimeError(f"every episode of task {task.task_id} failed; first: {episodes[0].error}")
        return ok

    def _start(self, task: Task, model: ModelHandle, run_index: int) -> Episode:
        episode = Episode(run_index, self.make_env())
        try:
            opening = call_with_timeout(
                episode.env.reset,
                task,
                timeout_s=self.env_timeout_s,
                what=f"{self.env_name}.reset",
                fault_site="env",
            )
            messages = self._with_stored_images(
                model, as_messages(opening), f"task {task.task_id} run {run_index}, {self.env_name}.reset"
            )
            episode.state = state_key(messages)
            episode.transcript = Transcript(
                model.tokenizer,
                messages,
                tools=episode.env.tool_schemas() or None,
                eos_ids=model.eos_ids,
                vision=model.vision if model.takes_images else None,
            )
        except TemplateError:
            raise
        except Exception as exc:
            self._fail(episode, f"reset: {exc!r}")
        return episode

    def _with_stored_images(
        self, model: ModelHandle, messages: list[dict[str, Any]], where: str
    ) -> list[dict[str, Any]]:
        """``messages`` with each image part's image checked and stored, the part holding its reference
        (what ``Transcript`` renders and the experiences carry); messages without images as they are."""
        out = []
        for m, message in enumerate(messages):
            content = message["content"]
            if not isinstance(content, list) or not any(_is_image_part(p) for p in content):
                out.append(message)
                continue
            if not model.takes_images:
                raise ValueError(
                    f"{where}: message {m} holds an image and the rollout model takes none: use a "
                    "vision-language model (e.g. `trivium make-tiny --vlm`), or an environment that answers in text"
                )
            parts = []
            for k, part in enumerate(content):
                if _is_image_part(part):
                    if "image" not in part:
                        raise ValueError(f"{where}: message {m} part {k} is an image part without 'image'")
                    (ref,) = model.put_images([part["image"]], f"{where}, message {m} part {k}")
                    part = {"type": "image", "image": ref}
                parts.append(part)
            out.append({**message, "content": parts})
        return out

    def _step(self, task: Task, e: Episode, action: str, model: ModelHandle) -> None:
        try:
            result = call_with_timeout(
                e.env.step,
                action,
                timeout_s=self.env_timeout_s,
                what=f"{self.env_name}.step",
                fault_site="env",
            )
            if not isinstance(result, StepResult):
                raise TypeError(
                    f"{type(e.env).__name__}.step returned {type(result).__name__}, not StepResult"
                )
        except Exception as exc:
            self._fail(e, f"step {len(e.rewards)}: {exc!r}")
            return
        e.rewards.append(float(result.reward))
        e.last = result
        if result.done:
            e.done, e.reason = True, "done"
        elif len(e.rewards) >= self.max_turns:
            e.done, e.reason = True, "max_turns"
        else:
            try:
                where = f"task {task.task_id} run {e.run_index}, {self.env_name}.step {len(e.rewards) - 1}"
                messages = self._with_stored_images(model, as_messages(result.observation), where)
                e.transcript.add_messages(messages)
                e.state = state_key(messages)
            except TemplateError:
                raise
            except Exception as exc:
                self._fail(e, f"observation {len(e.rewards)}: {exc!r}")
        if e.done:
            self._close(e)

    def _fail(self, e: Episode, reason: str) -> None:
        e.done, e.reason, e.error = True, "error", reason
        self._close(e)

    def _close(self, e: Episode) -> None:
        try:
            call_with_timeout(e.env.close, timeout_s=self.env_timeout_s, what=f"{self.env_name}.close")
        except Exception as exc:
            log.warning("closing environment %s failed: %r", self.env_name, exc)

    # ----------------------------------------------------------------------------------------- sizing
    def episode_size(self, task: Task, tokenizer, image_tokens: int | None = None) -> EpisodeSize:
        """How long an episode of ``task`` gets, for ``trivium doctor``: the opening (``reset``) and the
        environment's reply to one turn (an empty action: for most environments an invalid move, answered
        with the help text and the observation), rendered with the chat template; each image part counted as
        ``image_tokens``. When that step ends the episode or fails, the opening's last message stands in for
        the reply. The environment is closed afterwards."""
        from trivium.models.chat import render_ids

        env = self.make_env()
        try:
            opening = as_messages(
                call_with_timeout(
                    env.reset, task, timeout_s=self.env_timeout_s, what=f"{self.env_name}.reset"
                )
            )
            tools = env.tool_schemas() or None
            first = len(render_ids(tokenizer, _placeholders(opening), True, tools))
            first += _image_parts(opening) * ((image_tokens or 1) - 1)
            try:
                result = call_with_timeout(
                    env.step, "", timeout_s=self.env_timeout_s, what=f"{self.env_name}.step"
                )
                reply = None if result.done else as_messages(result.observation)
            except Exception:
                reply = None
            measured = reply is not None
            reply = reply or opening[-1:]
            probe = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]
            base = len(render_ids(tokenizer, probe, True, tools))
            after = len(render_ids(tokenizer, [*probe, *_placeholders(reply)], True, tools))
            turn = after - base + _image_parts(reply) * ((image_tokens or 1) - 1)
        finally:
            try:
                env.close()
            except Exception as exc:
                log.warning("closing environment %s after sizing failed: %r", self.env_name, exc)
        return EpisodeSize(opening=first, reply=turn, measured=measured, max_turns=self.max_turns)

    # -------------------------------------------------------------------------------------- experiences
    def episode_metrics(self, e: Episode) -> dict[str, float]:
        metrics = {"turns": float(len(e.rewards)), "episode_return": float(sum(e.rewards))}
        metrics["truncated"] = float(e.reason in ("max_turns", "context"))
        if e.last is not None:
            metrics.update({k: float(v) for k, v in e.last.info.items() if isinstance(v, (int, float, bool))})
        return {**metrics, **e.metrics}

    def experiences(self, task: Task, e: Episode) -> list[Experience]:
        t = e.transcript
        metrics = self.episode_metrics(e)
        return [
            Experience(
                tokens=torch.tensor(t.tokens, dtype=torch.long),
                prompt_length=t.prompt_length,
                action_mask=torch.tensor(t.mask, dtype=torch.bool),
                logprobs=torch.tensor(t.logprobs, dtype=torch.float32),
                reward=float(sum(e.rewards)),
                task_id=task.task_id,
                run_index=e.run_index,
                images=tuple(t.images),
                info={"end": e.reason, "turns": len(e.rewards), **e.info, **_versions_info(t.versions)},
                metrics={**metrics, "response_length": float(sum(t.mask))},
            )
        ]


@dataclass(frozen=True)
class EpisodeSize:
    """An episode's tokens as ``MultiTurnWorkflow.episode_size`` measures them."""

    opening: int  # the rendered opening messages, with the generation prompt
    reply: int  # one environment turn: its messages and the next generation prompt
    measured: (
        bool  # False: the probe step ended the episode or failed; ``reply`` is the opening's last message
    )
    max_turns: int

    def tokens(self, max_tokens: int) -> int:
        """The longest episode: every turn sampled to ``max_tokens`` (+1: an end-of-turn token the template
        adds when a turn hits the limit), a reply after each but the last."""
        return self.opening + self.max_turns * (max_tokens + 1) + (self.max_turns - 1) * self.reply


def state_key(messages: list[dict[str, Any]]) -> str:
    """The environment state an observation shows, as a short digest of its messages (images by their
    stored reference): turns that start from equal observations share a key (GiGPO's anchor states)."""
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _placeholders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each image part as a bare ``{"type": "image"}`` (what a template renders once)."""
    return [
        {**m, "content": [{"type": "image"} if _is_image_part(p) else p for p in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]


def _image_parts(messages: list[dict[str, Any]]) -> int:
    return sum(
        1 for m in messages if isinstance(m["content"], list) for p in m["content"] if _is_image_part(p)
    )


def _is_image_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image"


def prompt_images(transcript: Transcript):
    """The engine inputs of the transcript's images, or None without images."""
    return transcript.vision.prompt_images(transcript.images) if transcript.images else None


def _versions_info(versions: list[int]) -> dict:
    """``info["token_versions"]`` where the engine said which weights sampled the tokens."""
    return {"token_versions": version_runs(versions)} if any(v >= 0 for v in versions) else {}


@register_workflow("multi_turn")
class ConcatenatedMultiTurnWorkflow(MultiTurnWorkflow):
    """One experience per episode, environment tokens masked (see the module docstring)."""


@register_workflow("step_wise")
class StepWiseWorkflow(MultiTurnWorkflow):
    """One experience per model turn, rewarded with the return from that turn (see the module docstring).

    Extra arg: ``discount`` γ for the return (1.0: every turn gets the episode's remaining reward).
    """

    records_states = True

    def __init__(self, discount: float = 1.0, **args: Any):
        super().__init__(**args)
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0 <= discount <= 1:
            raise ValueError(f"workflow_args.discount must be a number in [0, 1], got {discount!r}")
        self.discount = discount

    def experiences(self, task: Task, e: Episode) -> list[Experience]:
        t = e.transcript
        returns, running = [], 0.0
        for r in reversed(e.rewards):
            running = r + self.discount * running
            returns.append(running)
        returns.reverse()
        metrics = self.episode_metrics(e)
        out = []
        for turn, ((start, end), ret, images) in enumerate(zip(e.turn_spans, returns, e.turn_images)):
            if turn < e.first_turn:
                continue
            out.append(
                Experience(
                    tokens=torch.tensor(t.tokens[:end], dtype=torch.long),
                    prompt_length=start,
                    action_mask=torch.ones(end - start, dtype=torch.bool),
                    logprobs=torch.tensor(t.logprobs[start - t.prompt_length : end - t.prompt_length]),
                    reward=float(ret),
                    task_id=task.task_id,
                    run_index=e.run_index,
                    turn=turn,
                    images=tuple(t.images[:images]),
                    info={
                        "end": e.reason,
                        "turns": len(e.rewards),
                        "step_reward": e.rewards[turn],
                        "state": e.turn_states[turn],
                        **e.info,
                        **_versions_info(t.versions[start - t.prompt_length : end - t.prompt_length]),
                    },
                    metrics={**metrics, "response_length": float(end - start)},
                )
            )
        return out


@register_workflow("react")
class ReActWorkflow(ConcatenatedMultiTurnWorkflow):
    """Tool-calling ReAct: the model reasons, calls tools (``<tool_call>`` JSON blocks, see
    ``trivium.tools.calls``), reads their results, and finally answers; the answer is scored with the
    task's reward function. The environment defaults to ``tools``; ``tools``, ``system_prompt`` and
    ``max_tool_calls`` are passed to it, ``max_turns`` bounds the model turns (the step limit).
    """

    default_env = "tools"

    def __init__(self, tools: list[str] | None = None, system_prompt: str | None = None, **args: Any):
        env_args = dict(args.pop("env_args", None) or {})
        if tools is not None:
            if isinstance(tools, str):
                raise ValueError(
                    f"workflow_args.tools must be a list of tool names, got {tools!r}; write [{tools!r}]"
                )
            if not isinstance(tools, (list, tuple)):
                raise ValueError(f"workflow_args.tools must be a list of tool names, got {tools!r}")
            env_args["tools"] = list(tools)
        if system_prompt is not None:
            env_args["system_prompt"] = system_prompt
        super().__init__(env_args=env_args, **args)
