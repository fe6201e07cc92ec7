"""Countdown: generated tasks are solvable and deterministic; the reward parses safely and checks both the
numbers used and the value."""

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from trivium.rewards import check_reward_args, get_reward_fn
from trivium.rewards.countdown import CountdownAnswer, evaluate, extract_expression
from trivium.tasks.countdown import CONFUSION, generate_rows, render, solve, write_countdown

reward = get_reward_fn("countdown")
TASK = {"numbers": [3, 5, 7], "target": 56}


@pytest.mark.parametrize(
    ("response", "score", "why"),
    [
        ("3+5=8\n8*7=56\n#### (3+5)*7", 1.0, "right"),
        ("<answer> 7*(5+3) </answer>", 1.0, "any order, any tree"),
        ("#### 3+5*7", 0.0, "precedence: 38"),
        ("#### (3+5)*7*1", 0.0, "1 is not given"),
        ("#### (3+5)*7+3-3", 0.0, "3 used three times"),
        ("#### 8*7", 0.0, "8 is not given"),
        ("#### __import__('os').system('true')", 0.0, "a call is refused, not run"),
        ("#### 7**2+7", 0.0, "** refused"),
        ("#### -3+59", 0.0, "unary minus refused"),
        ("#### 56.0", 0.0, "floats refused"),
        ("#### 7/(5-5)", 0.0, "division by zero"),
        ("no answer", 0.0, "last line is not an expression"),
        ("", 0.0, "empty"),
    ],
)
def test_reward_cases(response, score, why):
    assert reward(response, TASK).reward == score, why


def test_exact_division_and_the_metrics():
    task = {"numbers": [6, 4, 3], "target": 8}
    right = reward("#### 6*4/3", task)
    assert right.reward == 1.0 and right.metrics == {"accuracy": 1.0, "format": 1.0, "valid_numbers": 1.0}
    miss = get_reward_fn("countdown", {"format_score": 0.1})("#### 6+4", task)  # well-formed, misses
    assert miss.reward == 0.1 and miss.metrics == {"accuracy": 0.0, "format": 1.0, "valid_numbers": 1.0}
    bad = get_reward_fn("countdown", {"format_score": 0.1})("#### 6+5", task)
    assert bad.reward == 0.0 and bad.metrics["valid_numbers"] == 0.0
    assert (
        get_reward_fn("countdown", {"use_all": True})(
            "#### 6+4-3+1", {"numbers": [6, 4, 3, 1], "target": 8}
        ).reward
        == 1.0
    )
    assert (
        get_reward_fn("countdown", {"use_all": True})(
            "#### 6+4-3", {"numbers": [6, 4, 3, 1], "target": 7}
        ).reward
        == 0.0
    )


def test_evaluate_is_exact_and_whitelisted():
    assert evaluate("(1+2)/3*7") == (Fraction(7), [1, 2, 3, 7])
    assert evaluate("10/4") == (Fraction(5, 2), [10, 4])
    for text in ("a+1", "1 if 1 else 2", "[1][0]", "(1).__class__", "1+" * 150 + "1"):
        with pytest.raises(CountdownAnswer):
            evaluate(text)
    assert extract_expression("x <answer>1+1</answer> y <answer>2+2</answer>") == "2+2"
    assert extract_expression("work\n#### 1+2\nmore") == "1+2"
    assert extract_expression("one\n  1+2  \n\n") == "1+2"


def test_missing_task_fields_raise_a_clear_error_and_bad_args_are_refused():
    with pytest.raises(ValueError, match="needs the task fields 'numbers'"):
        reward("#### 1", {"question": "x"})
    with pytest.raises(ValueError, match="format_score"):
        check_reward_args("countdown", {"format_score": 2})
    with pytest.raises(TypeError, match="unknown args"):
        check_reward_args("countdown", {"target": 3})


@pytest.mark.parametrize("kw", [{}, {"n_numbers": 4, "ops": "+-*/", "shuffle": True, "max_number": 20}])
def test_every_generated_task_is_solvable_by_its_answer_and_by_search(kw):
    rows = generate_rows(60, seed=5, **kw)
    for row in rows:
        assert reward(row["answer"], row).reward == 1.0, row
        found = solve(row["numbers"], row["target"])  # an independent search finds a solution too
        assert found is not None and reward(f"#### {found}", row).reward == 1.0, row
        if not kw.get("shuffle"):
            final = row["answer"].split("\n")[-1]
            assert [int(n) for n in re.findall(r"\d+", final)] == row["numbers"]  # shown in the order used


def test_the_teacher_confuses_at_its_rates_and_works_its_ops_out():
    gold, noisy = generate_rows(3000, seed=1), generate_rows(3000, seed=1, noisy=True)
    flips, counts = dict.fromkeys("+-*", 0), dict.fromkeys("+-*", 0)
    for g, t in zip(gold, noisy):
        assert (g["numbers"], g["target"]) == (t["numbers"], t["target"])  # the same tasks
        for gl, tl in zip(g["answer"].split("\n")[:-1], t["answer"].split("\n")[:-1]):
            gop, top = _op(gl), _op(tl)
            counts[gop] += 1
            flips[gop] += gop != top
            left, right = tl.split("=")
            assert Fraction(eval_line(left)) == Fraction(right)  # the teacher's arithmetic is right
    for op in counts:
        assert abs(flips[op] / counts[op] - CONFUSION[op]) < 0.04, (op, flips[op] / counts[op])


def _op(line):
    left = line.split("=")[0]
    i = 1 if left.startswith("-") else 0  # a negative intermediate value
    while left[i].isdigit() or left[i] == "/":
        i += 1
    return left[i]


def eval_line(left):
    op = _op(left + "=")
    i = left.index(op, 1)
    a, b = Fraction(left[:i]), Fraction(left[i + 1 :])
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_render_adds_only_the_parentheses_it_needs():
    assert render([3, 5, 7], ["+", "*"]) == "(3+5)*7"
    assert render([3, 5, 7], ["*", "+"]) == "3*5+7"
    assert render([3, 5, 7], ["-", "-"]) == "3-5-7"


def test_files_are_deterministic_and_the_test_split_is_disjoint(tmp_path):
    a = write_countdown(tmp_path / "a", seed=2, n_train=200, n_test=40, n_sft=200)
    b = write_countdown(tmp_path / "b", seed=2, n_train=200, n_test=40, n_sft=200)
    for split in a:
        assert a[split].read_bytes() == b[split].read_bytes()
    questions = {s: {json.loads(x)["question"] for x in a[s].read_text().splitlines()} for s in a}
    assert not questions["test"] & (questions["train"] | questions["sft"])


def test_the_countdown_workflow_reads_rows_and_asks_the_shipped_question():
    from trivium.buffer.task_reader import TaskSetReader
    from trivium.workflows.registry import get_workflow

    workflow = get_workflow("countdown")
    path = Path(__file__).resolve().parents[2] / "examples" / "countdown" / "data" / "test.jsonl"
    reader = TaskSetReader(
        path,
        name="test",
        fields={k: k for k in workflow.fields},
        required=workflow.fields,
        workflow="countdown",
        reward_fn="countdown",
        repeat_times=1,
        reward_args={"format_score": 0.1},
    )
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    tasks = reader.all_tasks()
    assert len(tasks) == len(rows) and tasks[0].reward_args == {"format_score": 0.1}
    for task, row in zip(tasks[:20], rows):
        (message,) = workflow().messages(task)
        assert message == {"role": "user", "content": row["question"]}  # the SFT prompt, exactly
    with pytest.raises(ValueError, match=re.escape("'{numbers}' and '{target}'")):
        workflow(prompt_template="{question}")
