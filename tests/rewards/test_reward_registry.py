import pytest

from trivium.registry import UnknownPartError
from trivium.rewards import REWARD_FNS, RewardResult, get_reward_fn, register_reward


@pytest.fixture
def restore_registry():
    with REWARD_FNS.snapshot():
        yield


def test_builtins_are_registered_on_import():
    assert {"math_verify", "exact_match", "format"} <= set(REWARD_FNS)


def test_register_lookup_and_duplicate(restore_registry):
    @register_reward("always_one")
    def always_one(response, data):
        return RewardResult(1.0, {})

    assert get_reward_fn("always_one").__wrapped__ is always_one
    assert get_reward_fn("always_one")("x", {}) == RewardResult(1.0, {})
    with pytest.raises(ValueError, match="'always_one' is already registered"):
        register_reward("always_one")(always_one)


def test_a_plain_number_is_a_reward_and_nonsense_is_refused(restore_registry):
    register_reward("length")(lambda response, data: len(response))
    register_reward("text")(lambda response, data: "good")
    register_reward("infinite")(lambda response, data: float("inf"))
    assert get_reward_fn("length")("abc", {}) == RewardResult(3.0, {})
    with pytest.raises(TypeError, match="reward function 'text' returned str 'good': return a number"):
        get_reward_fn("text")("abc", {})
    with pytest.raises(ValueError, match="non-finite reward inf"):
        get_reward_fn("infinite")("abc", {})


def test_miss_lists_valid_names():
    valid = ", ".join(REWARD_FNS.names())  # sorted, every built-in
    with pytest.raises(UnknownPartError, match=f"unknown reward function 'nope'. valid: {valid};"):
        get_reward_fn("nope")


def test_importing_rewards_does_not_import_math_verify():
    import subprocess
    import sys

    code = "import sys, trivium.rewards; print('math_verify' in sys.modules, 'sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
