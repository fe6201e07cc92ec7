import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from trivium.rewards import extract_final_answer, get_reward_fn
from trivium.rewards.math import answers_equivalent, numbers_equal

GSM8K_GOLD = {"answer": "Zoe has 13 coins.\n13-4=9\n9-2=7\n#### 7"}
math_verify = get_reward_fn("math_verify")
exact_match = get_reward_fn("exact_match")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("13-4=9\n#### 9", "9"),
        ("#### 1\nmore\n#### 2\nnoise", "2"),  # the last marker wins, and only its first line
        ("so \\boxed{\\frac{1}{2}} or \\boxed{7}", "7"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("####   \n\\boxed{5}", "5"),  # an empty #### answer falls back to \boxed
        ("\\boxed{7", None),  # cut off
        ("the answer is 7", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    ("response", "gold", "accuracy", "fmt"),
    [
        ("9-2=7\n#### 7", GSM8K_GOLD, 1.0, 1.0),
        ("#### 7.0", GSM8K_GOLD, 1.0, 1.0),
        ("The answer is \\boxed{7}.", GSM8K_GOLD, 1.0, 1.0),
        ("#### 1,000", {"answer": "#### 1000"}, 1.0, 1.0),
        ("#### $1,000.", {"answer": 1000}, 1.0, 1.0),
        ("#### 8", GSM8K_GOLD, 0.0, 1.0),
        ("seven, I think", GSM8K_GOLD, 0.0, 0.0),
        ("#### 7", {"answer": 7}, 1.0, 1.0),
        ("#### 7", {"answer": 7.0}, 1.0, 1.0),
        ("#### 7", {"answer": "7"}, 1.0, 1.0),
        ("\\boxed{\\frac{1}{2}}", {"answer": "0.5"}, 1.0, 1.0),  # needs math-verify, not the fast path
        ("\\boxed{2^{10}}", {"answer": 1024}, 1.0, 1.0),
        ("#### 3/4", {"answer": "0.75"}, 1.0, 1.0),
    ],
)
def test_math_verify_reward(response, gold, accuracy, fmt):
    result = math_verify(response, gold)
    assert result.reward == accuracy
    assert result.metrics == {"accuracy": accuracy, "format": fmt}


def test_math_verify_works_from_worker_threads():
    # math-verify's default signal-based timeouts raise off the main thread; results must match the main thread.
    cases = [(f"#### {v}", {"answer": f"#### {w}"}) for v in range(20) for w in (v, v + 1)]
    cases += [("\\boxed{\\frac{1}{2}}", {"answer": "0.5"}), ("\\boxed{\\frac{1}{3}}", {"answer": "0.5"})]
    expected = [math_verify(r, d).reward for r, d in cases]
    assert threading.current_thread() is threading.main_thread()
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda c: math_verify(*c).reward, cases))
    assert got == expected
    assert sum(expected) == 21


def test_huge_powers_score_zero_quickly_off_the_main_thread():
    # Without a timeout, sympy would evaluate 9**(9**9) (a 370-million-digit integer) for minutes.
    with ThreadPoolExecutor(max_workers=1) as pool:
        for response in ("#### 9**9**9", "\\boxed{9^{9^{9}}}", "\\boxed{(10^{10})!}"):
            result = pool.submit(math_verify, response, {"answer": 7}).result(timeout=10)
            assert result.reward == 0.0 and result.metrics["format"] == 1.0


def test_numeric_fallback_when_math_verify_cannot_parse():
    assert numbers_equal("1,000", "1000.0000001")
    assert not numbers_equal("1000", "1001")
    assert not numbers_equal("abc", "abc")
    assert answers_equivalent("\\$18", "18")  # "\$18" bare does not parse; as LaTeX it does


@pytest.mark.parametrize(
    ("response", "gold", "accuracy", "fmt"),
    [
        ("13-4=9\n#### 7", GSM8K_GOLD, 1.0, 1.0),
        ("#### 7.0", GSM8K_GOLD, 0.0, 1.0),  # exact: "7.0" != "7"
        ("  7 \n", {"answer": 7}, 1.0, 0.0),  # no marker: the whole response is compared
        ("\\boxed{7}", {"answer": 7.0}, 1.0, 1.0),  # an integral float gold is written as an int
        ("#### 2.5", {"answer": 2.5}, 1.0, 1.0),
    ],
)
def test_exact_match(response, gold, accuracy, fmt):
    assert exact_match(response, gold).metrics == {"accuracy": accuracy, "format": fmt}


def test_missing_or_bad_gold_says_how_to_fix():
    with pytest.raises(KeyError, match=r"fields: \{answer: <your column>\}"):
        math_verify("#### 7", {"solution": "#### 7"})
    with pytest.raises(TypeError, match="field 'answer' must be str, int or float, got list"):
        exact_match("#### 7", {"answer": [7]})
