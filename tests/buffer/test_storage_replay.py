import pytest

from trivium.buffer.replay import ReplayPolicy, rank


def test_priority_prefers_newer_weights_and_fewer_uses():
    policy = ReplayPolicy(version_weight=2.0, use_weight=3.0)
    assert policy.priority(model_version=5, use_count=1) == 2.0 * 5 - 3.0 * 1


@pytest.mark.parametrize(
    ("use_count", "last_use_step", "step", "eligible"),
    [
        (0, None, 0, True),  # never used
        (1, 4, 6, False),  # used at 4, cooldown 2: not at 5 or 6...
        (1, 4, 7, True),  # ...but from 4 + 2 + 1 = 7
        (2, None, 9, False),  # max_uses reached
    ],
)
def test_eligibility(use_count, last_use_step, step, eligible):
    policy = ReplayPolicy(cooldown_steps=2, max_uses=2)
    assert policy.eligible(use_count, last_use_step, step) is eligible


def test_rank_takes_the_best_eligible_and_breaks_ties_by_id():
    policy = ReplayPolicy(version_weight=1.0, use_weight=1.0, cooldown_steps=0, max_uses=3)
    rows = [  # (id, model_version, use_count, last_use_step)
        (1, 2, 1, 0),  # priority 1
        (2, 1, 0, None),  # priority 1: tie with id 1, which goes first
        (3, 3, 0, None),  # priority 3
        (4, 9, 3, 0),  # retired
        (5, 4, 0, 5),  # used at this very step: cooling down
    ]
    assert rank(policy, rows, step=5, n=3) == [3, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"cooldown_steps": -1}, "cooldown_steps=-1"), ({"max_uses": 0}, "max_uses=0")]
)
def test_bad_settings_are_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayPolicy(**kwargs)
