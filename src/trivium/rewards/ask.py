"""``ask``: the Learn-to-Ask reward for one assistant turn of a logged dialogue (``tasks/ask.py``).

The sample says what the situation was at that point of the log, grounded in the log itself: ``missing``, the
number the conversation has not told yet (``start`` or ``step``), or null when everything is known, and the
problem's true ``answer``. A response earns 1.0 for the right move: the question about the missing number
while one is missing, the right ``#### N`` once none is; 0.0 otherwise (a guess, a needless or wrong
question, neither). Metrics: ``decision`` (it asked when a number was missing, answered when none was) and
``accuracy`` (the reward).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trivium.rewards.registry import RewardResult, register_reward
from trivium.tasks.ask import Problem, parse_turn


@register_reward("ask", task_fields=("missing", "answer", "name", "item", "start", "verb", "amount"))
def ask_reward(response: str, data: Mapping[str, Any]) -> RewardResult:
    try:
        problem = Problem.from_row(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"the ask reward needs the fields learn_to_ask samples carry (missing, name, item, start, verb, "
            f"amount; tasks/ask.py): {exc!r}"
        ) from exc
    kind, value = parse_turn(response, problem)
    if problem.missing is not None:
        decision = kind == "ask"
        right = decision and value == problem.missing
    else:
        decision = kind == "answer"
        right = decision and value == problem.value()
    return RewardResult(float(right), {"decision": float(decision), "accuracy": float(right)})
