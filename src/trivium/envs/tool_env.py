"""Question answering with tools: ``"tools"`` (tools chosen by name) and ``"calculator"`` (the calculator).

An episode: the model gets the question (after a system prompt), may call tools in the format of
``trivium.tools.calls`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks), sees each
result as a ``tool`` message, and ends with a turn without a tool call, its final answer, which the
task's reward fn scores (``reward_for(task)(answer, task.data)``, rewards/guard.py).

Design decisions:
- A turn with any tool-call block, well-formed or not, is a tool turn: malformed blocks come back as
  ``tool`` messages holding the parse error, so the model can retry, instead of being scored as an
  answer. Text beside the blocks is reasoning and is not scored.
- ``max_tool_calls`` counts every block (malformed ones too), so a model looping on broken calls still
  ends. The turn that would go over the limit runs none of its calls and ends the episode with reward 0
  and ``info["reason"] = "max_tool_calls"``.
- Tool calls earn 0: the reward is the final answer's, so the policy learns to call tools only when
  they help it answer.
- ``info`` is numeric except ``reason``: the reward fn's metrics on the final turn, plus ``tool_calls``
  (blocks so far), ``tool_errors`` (malformed blocks and failed runs) and ``turns``.
- Rows name the question in ``question_field``; a custom name is checked when the episode starts, and
  ``fields`` on the instance names it for loaders that check rows up front.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trivium.envs.base import Environment, StepResult, register_env
from trivium.rewards.guard import reward_for
from trivium.tools import get_tools, parse_tool_calls, run_tool
from trivium.types import Task

__all__ = ["DEFAULT_SYSTEM_PROMPT", "CalculatorEnv", "ToolEnv"]

DEFAULT_SYSTEM_PROMPT = (
    "Call a tool by writing <tool_call>\n"
    '{"name": "<tool>", "arguments": {...}}\n'
    "</tool_call> and wait for its result. When you know the answer, reply without a tool call and end "
    "with #### <answer>."
)


@register_env("tools")
class ToolEnv(Environment):
    """A question the model answers, calling tools on the way (see the module docstring).

    Args:
        tools: names in ``trivium.tools.TOOLS`` offered to the model.
        system_prompt: the first message; None uses ``DEFAULT_SYSTEM_PROMPT``, "" sends none.
        question_field: the task row field holding the question.
        max_tool_calls: tool-call blocks allowed per episode; one more ends it with reward 0.
    """

    def __init__(
        self,
        tools: Sequence[str] = ("calculator",),
        system_prompt: str | None = None,
        question_field: str = "question",
        max_tool_calls: int = 4,
        show_tools: bool = True,
    ):
        if isinstance(tools, str):
            raise TypeError(
                f"tools must be a list of tool names, got the string {tools!r}; write [{tools!r}]"
            )
        if isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int) or max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be an integer >= 0, got {max_tool_calls!r}")
        self.tools = {t.name: t for t in get_tools(list(tools))}  # KeyError lists the registered tools
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.question_field = question_field
        self.max_tool_calls = max_tool_calls
        self.show_tools = bool(show_tools)
        self.fields = {question_field: (str,)}
        self.task: Task | None = None
        self.tool_calls = self.tool_errors = self.turns = 0
        self.done = False

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' schemas for the chat template; none when ``show_tools`` is False (a model that
        learned the tools from demonstrations, e.g. a tiny one, then gets a much shorter prompt)."""
        return [tool.schema() for tool in self.tools.values()] if self.show_tools else []

    def reset(self, task: Task) -> list[dict[str, Any]]:
        question = task.data.get(self.question_field)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(
                f"task {task.task_id!r}: the '{self.name}' environment reads the question from field "
                f"'{self.question_field}', which is {question!r:.60} (row fields: {sorted(task.data)}); map "
                f"the question column with fields: {{{self.question_field}: <your column>}} or set "
                "env_args.question_field"
            )
        reward_for(task)  # an unknown reward name fails now, not after the episode
        self.task = task
        self.tool_calls = self.tool_errors = self.turns = 0
        self.done = False
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": question}]

    def step(self, action: str) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError(
                f"{type(self).__name__}.step() called "
                f"{'after the episode ended' if self.done else 'before reset()'}; "
                "environments are made fresh for every episode"
            )
        self.turns += 1
        parsed = parse_tool_calls(action, id_prefix=f"call_{self.turns}")
        blocks = len(parsed.calls) + len(parsed.errors)
        if blocks == 0:
            return self._final_answer(action)
        if self.tool_calls + blocks > self.max_tool_calls:
            self.tool_calls += blocks
            self.done = True
            return StepResult(reward=0.0, done=True, info={**self._counts(), "reason": "max_tool_calls"})
        self.tool_calls += blocks
        messages: list[dict[str, Any]] = []
        for call in parsed.calls:
            result, ok = run_tool(self.tools, call)
            self.tool_errors += not ok
            messages.append({"role": "tool", "content": result, "tool_call_id": call.id})
        for error in parsed.errors:
            self.tool_errors += 1
            messages.append({"role": "tool", "content": f"error: {error}"})
        return StepResult(observation=messages, reward=0.0, done=False, info=self._counts())

    def _final_answer(self, answer: str) -> StepResult:
        assert self.task is not None
        result = reward_for(self.task)(answer, self.task.data)
        self.done = True
        info = {**result.metrics, **self._counts()}
        return StepResult(reward=float(result.reward), done=True, info=info)

    def _counts(self) -> dict[str, float]:
        return {
            "tool_calls": float(self.tool_calls),
            "tool_errors": float(self.tool_errors),
            "turns": float(self.turns),
        }


@register_env("calculator")
class CalculatorEnv(ToolEnv):
    """``ToolEnv`` with the calculator as its only tool (the same arguments, less ``tools``)."""

    def __init__(
        self,
        system_prompt: str | None = None,
        question_field: str = "question",
        max_tool_calls: int = 4,
        show_tools: bool = True,
    ):
        super().__init__(
            tools=("calculator",),
            system_prompt=system_prompt,
            question_field=question_field,
            max_tool_calls=max_tool_calls,
            show_tools=show_tools,
        )
