"""Agents used by the openai_agent workflow tests: plain OpenAI-client code, as a user would write it."""

import json

from trivium.rewards.registry import get_reward_fn
from trivium.tools import TOOLS, calculate

SEEN: list[tuple[str, int, str]] = []  # (task id, run, session base url) of every episode


def calculator_agent(task, api, max_turns: int = 3):
    """A hand-written ReAct loop over the chat API with the calculator tool."""
    SEEN.append((task.task_id, api.run_index, api.base_url))
    client = api.client()
    messages = [{"role": "user", "content": task.data["question"]}]
    reply = ""
    for _ in range(max_turns):
        out = client.chat.completions.create(
            model=api.model, messages=messages, tools=[TOOLS.get("calculator").schema()], max_tokens=12
        )
        message = out.choices[0].message
        reply = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = calculate(**json.loads(call.function.arguments))
            except Exception as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    result = get_reward_fn("math_verify")(reply, task.data)
    return result.reward, {"calls": float(len(messages))}


def silent_agent(task, api):
    return 1.0
