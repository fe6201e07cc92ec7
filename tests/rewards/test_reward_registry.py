import pytest

from trivium.rewards import REWARD_FNS, RewardResult, get_reward_fn, register_reward


@pytest.fixture
def restore_registry():
    saved = dict(REWARD_FNS)
    yield
    REWARD_FNS.clear()
    REWARD_FNS.update(saved)


def test_builtins_are_registered_on_import():
    assert {"math_verify", "exact_match"} <= set(REWARD_FNS)


def test_register_lookup_and_duplicate(restore_registry):
    @register_reward("always_one")
    def always_one(response, data):
        return RewardResult(1.0, {})

    assert get_reward_fn("always_one") is always_one
    with pytest.raises(ValueError, match="'always_one' is already registered"):
        register_reward("always_one")(always_one)


def test_miss_lists_valid_names():
    with pytest.raises(KeyError, match=r"unknown reward_fn 'nope'.*'exact_match', 'math_verify'"):
        get_reward_fn("nope")


def test_importing_rewards_does_not_import_math_verify():
    import subprocess
    import sys

    code = "import sys, trivium.rewards; print('math_verify' in sys.modules, 'sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
