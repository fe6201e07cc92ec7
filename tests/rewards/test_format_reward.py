"""The ``format`` reward: templates and regexes from ``reward_args``, checked before the run."""

import re

import pytest

from trivium.rewards import check_reward_args, get_reward_fn
from trivium.rewards.format import template_regex

THINK = "<think>{}</think>\n<answer>{}</answer>"


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ("<think>a\nb</think>\n<answer>7</answer>", True),
        ("  <think>x</think><answer>7</answer>\n", True),  # whitespace runs match any whitespace, or none
        ("<think></think> <answer></answer>", True),  # a hole may be empty
        ("<answer>7</answer>", False),
        ("<think>x</think>\n<answer>7</answer> and more", False),  # the whole response must match
        ("<think>x</think>\n<answer>7", False),
    ],
)
def test_template_holes_match_any_text_and_the_rest_is_literal(response, ok):
    result = get_reward_fn("format", {"template": THINK})(response, {})
    assert (result.reward, result.metrics["format"]) == (float(ok), float(ok))


def test_template_braces_and_regex_characters_are_literal():
    regex = template_regex("f({x}) = {{y}} * 2.")
    assert re.fullmatch(regex, "f(3) = {y} * 2.", re.DOTALL)
    assert not re.fullmatch(regex, "f(3) = {y} * 22", re.DOTALL)  # '.' is a dot, not any character
    with pytest.raises(ValueError, match="lone '}'"):
        template_regex("a } b")


def test_pattern_full_search_flags_and_scores():
    full = get_reward_fn("format", {"pattern": r"#### -?\d+"})
    assert full("#### 12", {}).reward == 1.0 and full("x\n#### 12", {}).reward == 0.0
    search = get_reward_fn("format", {"pattern": r"^#### -?\d+$", "match": "search", "flags": ["MULTILINE"]})
    assert search("work\n#### -3\n", {}).reward == 1.0
    scored = get_reward_fn(
        "format", {"pattern": "yes", "flags": ["IGNORECASE"], "reward": 0.5, "penalty": -1}
    )
    assert (scored("YES", {}).reward, scored("no", {}).reward) == (0.5, -1.0)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({}, "exactly one of reward_args.pattern and reward_args.template"),
        ({"pattern": "a", "template": "b"}, "exactly one"),
        ({"pattern": "(unclosed"}, "not a valid regular expression"),
        ({"pattern": "a", "flags": ["MULTILIN"]}, "not re flags"),
        ({"pattern": "a", "flags": "MULTILINE"}, "must be a list"),
        ({"pattern": "a", "match": "prefix"}, "'full' or 'search'"),
        ({"template": "{} }"}, "lone"),
        ({"pattern": "a", "reward": "high"}, "reward_args.reward must be a number"),
    ],
)
def test_bad_args_are_refused_by_check_args(args, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_reward_args("format", args)


def test_unknown_arg_is_refused_with_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown args \['regex'\]; valid args: flags, match, pattern"):
        check_reward_args("format", {"regex": "a"})
