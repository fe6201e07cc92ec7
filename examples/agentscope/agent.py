"""An AgentScope ReAct agent with a calculator tool, trained through trivium's recording endpoint.

The agent is ordinary AgentScope 2.x code (``Agent`` + ``OpenAIChatModel`` + ``Toolkit``); the only
trivium-specific part is where its model points: ``api.base_url`` / ``api.api_key`` / ``api.model`` of
the ``openai_agent`` workflow, a URL bound to this run's recording session. Every model call AgentScope
makes is sampled by the rollout model and recorded with its token ids and log-probs; this function only
runs one episode and returns the reward. Config: ``examples/agentscope/agentscope.yaml``.

Settings that matter for training (each is explained where it is set):
- no sampling parameters are sent (no temperature, top_p, max_tokens), so the endpoint samples with the
  run's ``explorer.rollout`` settings, the ones the trainer assumes;
- retries are off (AgentScope's and the OpenAI client's): a retried request that reached the engine
  would be recorded twice;
- message ``name`` fields are dropped (``_UnnamedFormatter``), so the endpoint recognises the assistant
  message it returned and continues the conversation token for token;
- runtime-state injection (the current time, every turn) is off: prompts stay deterministic;
- the tool is allowed up front (AgentScope asks a human to confirm custom tools by default).

Robustness: AgentScope itself turns a malformed tool call, an unknown tool, bad arguments or a failing
tool into a tool result the model sees. What remains is the endpoint refusing a request (HTTP 400, e.g. a
conversation longer than a tiny model's 512-token context, or one its chat template cannot render):
the episode then ends with reward 0, its calls so far are still trained on, and ``metrics["refused"]``
is 1 (``metrics["error"]`` holds the message; the workflow keeps numeric metrics only).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from trivium.rewards import get_reward_fn
from trivium.tools import calculate
from trivium.types import Task

__all__ = ["SYSTEM_PROMPT", "calculator", "calculator_agent", "run_episode"]

SYSTEM_PROMPT = "Call the calculator tool to compute, then give the result as '#### N'."


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression (`str`):
            e.g. 37 * 48 + 2
    """
    # A ValueError or SyntaxError here becomes an error tool result (AgentScope catches tool exceptions).
    return calculate(expression)


def calculator_agent(task: Task, api: Any, max_iters: int = 2, stream: bool = False) -> tuple[float, dict]:
    """One episode on ``task.data["question"]``: ``(reward, metrics)``, the reward by ``task.reward_fn``
    (``math_verify`` when unset) on the final reply against ``task.data["answer"]``.

    ``api`` is the workflow's ``AgentAPI`` (``base_url``, ``api_key``, ``model``). ``max_iters``: ReAct
    rounds with tools before AgentScope forces a final answer (one more call, tools off). ``stream``: use
    streamed chat completions (recorded the same way). Both can be set in the config's
    ``workflow_args.agent_args``.
    """
    return asyncio.run(run_episode(task, api, max_iters=max_iters, stream=stream))


async def run_episode(task: Task, api: Any, max_iters: int = 2, stream: bool = False) -> tuple[float, dict]:
    """``calculator_agent`` for callers that already run an event loop."""
    try:
        import openai
        from agentscope.agent import Agent, InjectionConfig, ReActConfig
        from agentscope.credential import OpenAICredential
        from agentscope.message import UserMsg
        from agentscope.model import OpenAIChatModel
        from agentscope.permission import PermissionBehavior, PermissionDecision
        from agentscope.tool import FunctionTool, Toolkit
    except ImportError as exc:
        raise ImportError(
            f"the AgentScope example needs agentscope ({exc}); install it with pip install -e '.[agentscope]'"
        ) from exc

    model = OpenAIChatModel(
        OpenAICredential(api_key=api.api_key, base_url=api.base_url),
        model=api.model,
        stream=stream,
        max_retries=0,  # AgentScope's own retries (on 5xx, timeouts): a retry could record a call twice
        client_kwargs={"max_retries": 0},  # the OpenAI client's retries, for the same reason
        formatter=_unnamed_formatter_class()(),
    )
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="the calculator is harmless")
    agent = Agent(
        name="calculator_agent",
        system_prompt=SYSTEM_PROMPT,
        model=model,
        toolkit=Toolkit(tools=[FunctionTool(calculator, permission=allow)]),
        react_config=ReActConfig(max_iters=max_iters),
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    metrics: dict[str, Any] = {"refused": 0.0}
    text = ""
    try:
        reply = await agent.reply(UserMsg(name="user", content=str(task.data["question"])))
        text = reply.get_text_content() or ""
    except openai.BadRequestError as exc:  # the endpoint refused a request: the episode ends here
        metrics.update(refused=1.0, error=f"{type(exc).__name__}: {_message(exc)}")
    finally:
        await model.client.close()
    metrics["tool_calls"] = float(
        sum(len(m.get_content_blocks("tool_call")) for m in agent.state.context if m.role == "assistant")
    )
    if metrics["refused"]:
        return 0.0, metrics
    result = get_reward_fn(task.reward_fn or "math_verify")(text, task.data)
    return float(result.reward), {**metrics, **result.metrics}


def _message(exc: Any) -> str:
    """The endpoint's error message (``{"error": {"message": ...}}``), else the exception's text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        body = body.get("error", body)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(exc)


@functools.cache
def _unnamed_formatter_class():
    """AgentScope's OpenAI chat formatter without the messages' ``name`` fields.

    AgentScope sends every message with ``name`` (the agent's name on assistant messages). The endpoint
    continues an earlier call's tokens only when the history holds exactly the assistant message it
    returned (which has no name); with a name it re-renders the history as text instead, which can
    tokenise a sampled reply differently from how it was sampled. Chat templates ignore ``name``.
    """
    from agentscope.formatter import OpenAIChatFormatter

    class UnnamedFormatter(OpenAIChatFormatter):
        async def format(self, msgs):
            messages = await super().format(msgs)
            return [{k: v for k, v in m.items() if k != "name"} for m in messages]

    return UnnamedFormatter
