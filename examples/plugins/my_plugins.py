"""Your own parts, in your own module: one of each seam Trivium lets you plug in (see docs/plugins.md).

``plugins.yaml`` lists this module under ``plugins:``, so it is imported before the config is checked and
everything it registers can be named like a built-in part. A part can also be named ``module:attr``
without being registered (``my_plugins:brevity_reward`` below).

| seam | here | named in the config as |
| --- | --- | --- |
| reward function | ``brevity_reward`` (not registered) | ``reward_fn: my_plugins:brevity_reward`` |
| workflow | ``MathHintWorkflow`` | ``workflow: math_hint`` |
| policy loss | ``capped_pg`` | ``policy_loss_fn: capped_pg`` (here through the preset) |
| algorithm preset | ``grpo_capped`` | ``algorithm_type: grpo_capped`` |
| environment | ``GuessNumberEnv`` | ``workflow_args: {env: guess_number}`` |
| tool | ``word_length`` | ``workflow_args: {tools: [word_length]}`` |
| agent | ``one_shot_agent`` | ``workflow_args: {agent: one_shot}`` |
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from trivium.algorithm import POLICY_LOSS_FNS, PolicyLossInputs
from trivium.algorithm.presets import PRESETS, AlgorithmPreset
from trivium.envs import Environment, StepResult, register_env
from trivium.rewards import RewardResult, get_reward_fn
from trivium.tools import Tool, register_tool
from trivium.workflows import register_workflow
from trivium.workflows.agent import register_agent
from trivium.workflows.math import MathWorkflow


# --- a reward function: fn(response, task data) -> RewardResult (or a plain number) ----------------------
def brevity_reward(response: str, data: Mapping[str, Any]) -> RewardResult:
    """math_verify's accuracy minus 0.01 per word beyond 12: right and short beats right and long."""
    accuracy = get_reward_fn("math_verify")(response, data).reward
    words = len(response.split())
    return RewardResult(accuracy - 0.01 * max(0, words - 12), {"accuracy": accuracy, "words": float(words)})


# --- a workflow: a Workflow subclass; its constructor takes workflow_args ---------------------------------
@register_workflow("math_hint")
class MathHintWorkflow(MathWorkflow):
    """The math workflow with a hint after every question."""

    def __init__(self, hint: str = "End with #### and the number.", **args: Any):
        super().__init__(**args)
        if not isinstance(hint, str):
            raise TypeError(f"workflow_args.hint must be a string, got {hint!r}")
        self.hint = hint

    def messages(self, task):
        messages = super().messages(task)
        messages[-1] = {"role": "user", "content": f"{messages[-1]['content']} {self.hint}"}
        return messages


# --- a policy loss, and an algorithm preset that uses it -----------------------------------------------------
@POLICY_LOSS_FNS.register("capped_pg")
def capped_pg(inputs: PolicyLossInputs, *, cap: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    """λ = −sg[min(ρ, cap)] · A · log π: importance-weighted policy gradient whose weight never exceeds cap."""
    if cap <= 0:
        raise ValueError(f"capped_pg: cap must be > 0, got {cap}")
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-20, 20)
    weight = torch.exp(log_ratio).clamp(max=cap).detach()
    return torch.where(inputs.mask, -weight * inputs.advantages * inputs.logprobs, 0.0), {}


PRESETS.register("grpo_capped")(
    AlgorithmPreset(
        name="grpo_capped",
        advantage_fn="grpo",
        policy_loss_fn="capped_pg",
        aggregation="token-mean",
        needs_rollouts=True,
        needs_reference=False,
        description="GRPO's group-normalised advantages with the capped importance-weighted policy gradient.",
        advantage_args={"std_normalize": True, "epsilon": 1e-6},
        policy_loss_args={"cap": 2.0},
        kl_estimator="k3",
    )
)


# --- an environment: reset(task) -> opening message, step(text) -> StepResult ------------------------------
@register_env("guess_number")
class GuessNumberEnv(Environment):
    """Guess the task's number; the environment answers 'higher' or 'lower'. Reward 1 for a hit."""

    fields: ClassVar[Mapping[str, tuple[type, ...]]] = {"target": (int,)}

    def __init__(self, low: int = 1, high: int = 8):
        if not low < high:
            raise ValueError(f"env_args: low ({low}) must be below high ({high})")
        self.low, self.high = low, high
        self.target = 0
        self.guesses = 0

    def reset(self, task) -> str:
        self.target, self.guesses = int(task.data["target"]), 0
        return f"Guess my number from {self.low} to {self.high}. Reply with one number."

    def step(self, action: str) -> StepResult:
        self.guesses += 1
        found = re.search(r"-?\d+", action)
        if found is None:
            return StepResult("Reply with one number.", info={"guesses": float(self.guesses)})
        guess = int(found.group())
        if guess == self.target:
            return StepResult(reward=1.0, done=True, info={"guesses": float(self.guesses)})
        hint = "higher" if guess < self.target else "lower"
        return StepResult(f"{guess} is wrong: go {hint}.", info={"guesses": float(self.guesses)})


# --- a tool: a JSON-schema description and a function --------------------------------------------------------
def word_length(word: str) -> str:
    return str(len(word.strip()))


register_tool(
    Tool(
        name="word_length",
        description="Count the letters of a word.",
        parameters={
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
        },
        fn=word_length,
    )
)


# --- an agent: any code that talks to an OpenAI-compatible endpoint --------------------------------------------
@register_agent("one_shot")
def one_shot_agent(task, api) -> tuple[float, dict[str, float]]:
    """Ask once through the OpenAI client bound to this run's recording session; score the reply."""
    client = api.client()
    reply = client.chat.completions.create(
        model=api.model, messages=[{"role": "user", "content": task.data["question"]}]
    )
    text = reply.choices[0].message.content or ""
    return get_reward_fn("math_verify")(text, task.data).reward, {"reply_chars": float(len(text))}
