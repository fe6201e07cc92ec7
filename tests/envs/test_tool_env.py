import subprocess
import sys

import pytest

from trivium.envs.base import make_env
from trivium.envs.tool_env import CalculatorEnv, ToolEnv
from trivium.rewards.guard import FAILURE_COUNTS
from trivium.tools import format_tool_call
from trivium.types import Task

QUESTION = "What is 6 * 7?"


def task(**data):
    data = {"question": QUESTION, "answer": "42", **data}
    return Task(task_id="q:0", data=data, workflow="multi_turn", reward_fn="math_verify")


def calc(expression):
    return format_tool_call("calculator", {"expression": expression})


def test_calculator_env_offers_the_calculator():
    env = make_env("calculator")
    assert isinstance(env, CalculatorEnv) and env.name == "calculator"
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["calculator"]
    messages = env.reset(task())
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == QUESTION
    assert "<tool_call>" in messages[0]["content"] and "####" in messages[0]["content"]


def test_tool_call_then_scored_answer():
    env = make_env("tools", tools=["calculator"])
    env.reset(task())
    result = env.step(f"Let me compute.\n{calc('37 * 48')}")
    assert not result.done and result.reward == 0.0
    assert list(result.observation) == [{"role": "tool", "content": str(37 * 48), "tool_call_id": "call_1_0"}]
    final = env.step("6 * 7 = 42\n#### 42")
    assert final.done and final.reward == 1.0
    counts = dict.fromkeys(FAILURE_COUNTS, 0.0)  # the guarded reward's failure counts (rewards/guard.py)
    assert final.info == {
        "accuracy": 1.0, "format": 1.0, "tool_calls": 1.0, "tool_errors": 0.0, "turns": 2.0, **counts
    }  # fmt: skip


def test_wrong_answer_scores_zero():
    env = make_env("calculator")
    env.reset(task())
    final = env.step("#### 41")
    assert final.done and final.reward == 0.0 and final.info["accuracy"] == 0.0


def test_two_calls_in_one_turn_get_two_messages():
    env = make_env("calculator")
    env.reset(task())
    result = env.step(calc("1 + 1") + calc("2 ** 10"))
    assert [(m["content"], m["tool_call_id"]) for m in result.observation] == [
        ("2", "call_1_0"),
        (str(2**10), "call_1_1"),
    ]


def test_malformed_call_returns_the_error_and_is_not_scored():
    env = make_env("calculator")
    env.reset(task())
    result = env.step('<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>')
    assert not result.done and result.reward == 0.0
    (message,) = result.observation
    assert message["role"] == "tool" and message["content"].startswith("error: tool call 0: body is not JSON")
    assert result.info["tool_errors"] == 1.0 and result.info["tool_calls"] == 1.0


def test_unknown_tool_and_failing_tool_are_errors():
    env = make_env("calculator")
    env.reset(task())
    result = env.step(format_tool_call("search", {"query": "x"}) + calc("import os"))
    unknown, failed = (m["content"] for m in result.observation)
    assert "unknown tool 'search'" in unknown and "calculator" in unknown
    assert failed.startswith("error: SyntaxError")
    assert result.info["tool_errors"] == 2.0


def test_max_tool_calls_ends_the_episode():
    env = make_env("calculator", max_tool_calls=2)
    env.reset(task())
    assert not env.step(calc("1 + 1")).done
    result = env.step(calc("2 + 2") + calc("3 + 3"))  # 1 + 2 blocks > 2: none of them runs
    assert result.done and result.reward == 0.0
    assert result.info["reason"] == "max_tool_calls" and result.info["tool_calls"] == 3.0
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("#### 42")


def test_custom_question_field_and_no_system_prompt():
    env = ToolEnv(system_prompt="", question_field="prompt")
    assert env.fields == {"prompt": (str,)}
    assert env.reset(task(prompt="Add 2 and 2.")) == [{"role": "user", "content": "Add 2 and 2."}]


def test_bad_setup_errors_name_the_problem():
    with pytest.raises(KeyError, match=r"unknown tool 'nope'.*valid: calculator"):
        ToolEnv(tools=["nope"])
    with pytest.raises(TypeError, match="list of tool names"):
        ToolEnv(tools="calculator")
    with pytest.raises(ValueError, match="field 'prompt'"):
        ToolEnv(question_field="prompt").reset(task())
    bad_reward = Task("q:1", {"question": QUESTION, "answer": "42"}, "multi_turn", reward_fn="no_such_reward")
    with pytest.raises(KeyError, match="unknown reward function 'no_such_reward'"):
        make_env("calculator").reset(bad_reward)


def test_tool_envs_load_without_importing_gymnasium():
    code = (
        "import sys; from trivium.envs.base import make_env; make_env('calculator'); "
        "print('gymnasium' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
