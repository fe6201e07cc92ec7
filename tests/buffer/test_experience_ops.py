"""Experience operators on hand-made groups: each filter and shaper, the pipeline's counts, user operators."""

from pathlib import Path

import pytest
import torch

from trivium.buffer.operators import EXPERIENCE_OPS, ExperiencePipeline
from trivium.types import Experience


def exp(
    reward: float, length: int = 3, *, text: str = "", finish: str | None = "stop", gid: int = 0, tok: int = 7
):
    """An experience with a 2-token prompt and ``length`` response tokens, all equal to ``tok``."""
    info = {"response": text} if finish is None else {"response": text, "finish_reason": finish}
    return Experience(
        tokens=torch.tensor([1, 2] + [tok] * length),
        prompt_length=2,
        action_mask=torch.ones(length, dtype=torch.bool),
        logprobs=torch.zeros(length),
        reward=reward,
        group_id=gid,
        info=info,
    )


def run(name, groups, **args):
    return ExperiencePipeline([(name, args)])(groups)


def test_zero_variance_drops_all_equal_groups_and_groups_of_one():
    varied = [exp(1.0), exp(0.0)]
    groups, m = run("zero_variance", [[exp(1.0), exp(1.0)], varied, [exp(0.5)]])
    assert groups == [varied]
    assert m == {
        "ops/zero_variance/kept": 2.0,
        "ops/zero_variance/changed": 0.0,
        "ops/zero_variance/dropped": 3.0,  # 2 + 1 experiences of the two dropped groups
        "ops/zero_variance/dropped_groups": 2.0,
        "ops/zero_variance/reward_mean": 0.5,  # of what passed on
    }
    close = [exp(0.5), exp(0.55)]
    assert run("zero_variance", [close], eps=0.1)[0] == []  # a spread of 0.05 <= eps


def test_reward_range_keeps_rewards_inside_the_bounds():
    g = [exp(-1.0), exp(0.0), exp(0.5), exp(2.0)]
    groups, m = run("reward_range", [g], min=0.0, max=1.0)
    assert [e.reward for e in groups[0]] == [0.0, 0.5]
    assert m["ops/reward_range/dropped"] == 2 and m["ops/reward_range/dropped_groups"] == 0


def test_response_length_bounds():
    g = [exp(0, length=n) for n in (1, 3, 5, 8)]
    groups, _ = run("response_length", [g], min_tokens=3, max_tokens_kept=5)
    assert [e.response_length for e in groups[0]] == [3, 5]


def test_truncated_uses_the_finish_reason_else_the_token_limit():
    cut, done = exp(0, length=4, finish="length"), exp(1, length=4, finish="stop")
    unknown_long, unknown_short = exp(0, length=8, finish=None), exp(1, length=2, finish=None)
    groups, m = run("truncated", [[cut, done], [unknown_long, unknown_short]], max_tokens=8)
    assert groups == [[done], [unknown_short]]
    assert m["ops/truncated/dropped"] == 2
    groups, m = run("truncated", [[cut, done], [unknown_short]], max_tokens=8, whole_group=True)
    assert groups == [[unknown_short]] and m["ops/truncated/dropped_groups"] == 1


def test_the_pipeline_gives_max_tokens_from_the_rollout_config():
    long = exp(0, length=8, finish=None)
    assert ExperiencePipeline([("truncated", {})], max_tokens=8)([[long]])[0] == []
    assert ExperiencePipeline([("truncated", {})], max_tokens=9)([[long]])[0] == [[long]]


def test_invalid_format_drops_responses_that_do_not_match():
    good, bad = exp(1, text="<answer>4</answer>"), exp(0, text="four")
    assert run("invalid_format", [[good, bad]], pattern=r"<answer>.*</answer>")[0] == [[good]]
    prefixed = exp(1, text="so <answer>4</answer>")
    assert run("invalid_format", [[prefixed]], pattern=r"<answer>.*</answer>", full=True)[0] == []


def test_duplicate_responses_keep_the_first_of_each_token_sequence_within_a_group():
    a1, a2, b = exp(1, tok=5), exp(0, tok=5), exp(0, tok=6)
    other_group = exp(1, tok=5, gid=1)  # the same tokens in another group are not duplicates
    groups, m = run("duplicate_responses", [[a1, a2, b], [other_group]])
    assert groups == [[a1, b], [other_group]]
    assert m["ops/duplicate_responses/dropped"] == 1


def test_format_bonus_changes_rewards_and_counts_changed():
    good, bad = exp(1.0, text="#### 4"), exp(0.0, text="4")
    groups, m = run("format_bonus", [[good, bad]], pattern=r"#### \d+", bonus=0.25, penalty=-0.5)
    assert [e.reward for e in groups[0]] == [1.25, -0.5]
    assert m["ops/format_bonus/changed"] == 2 and m["ops/format_bonus/kept"] == 0
    groups, m = run("format_bonus", [[good, bad]], pattern=r"#### \d+", bonus=0.25)
    assert groups[0][1] is bad  # penalty 0: unchanged, the same object, counted as kept
    assert (m["ops/format_bonus/kept"], m["ops/format_bonus/changed"]) == (1.0, 1.0)


def test_length_penalty_is_linear_beyond_the_target():
    g = [exp(1.0, length=n) for n in (2, 5, 10)]
    groups, _ = run("length_penalty", [g], coef=0.1, target=4)
    # r - 0.1 * max(0, n - 4): 1.0, 1.0 - 0.1, 1.0 - 0.6
    assert [e.reward for e in groups[0]] == pytest.approx([1.0, 0.9, 0.4])


def test_overlong_penalty_is_dapos_ramp():
    # max 10, cache 4: soft limit 6; n=6 -> 0, n=8 -> (6 - 8) / 4 = -0.5, n=10 -> -1, n=12 -> -1
    g = [exp(1.0, length=n) for n in (6, 8, 10, 12)]
    groups, m = run("overlong_penalty", [g], max_tokens=10, cache_length=4, factor=2.0)
    assert [e.reward for e in groups[0]] == pytest.approx([1.0, 1.0 - 1.0, 1.0 - 2.0, 1.0 - 2.0])
    assert m["ops/overlong_penalty/kept"] == 1 and m["ops/overlong_penalty/changed"] == 3


def test_reward_scale_scales_shifts_and_clips():
    g = [exp(r) for r in (-2.0, 0.0, 0.5, 3.0)]
    groups, _ = run("reward_scale", [g], scale=2.0, shift=-1.0, clip_min=-1.5, clip_max=1.5)
    # 2r - 1: -5 -> -1.5 (clip), -1, 0, 5 -> 1.5 (clip)
    assert [e.reward for e in groups[0]] == [-1.5, -1.0, 0.0, 1.5]
    groups, m = run("reward_scale", [g])
    assert m["ops/reward_scale/kept"] == 4 and all(a is b for a, b in zip(groups[0], g, strict=True))


def test_operators_run_in_order_and_report_each():
    # the bonus first makes the all-zero group varied, so zero_variance keeps it; the other way round not
    g = [exp(0.0, text="#### 1"), exp(0.0, text="1")]
    bonus_first = ExperiencePipeline([("format_bonus", {"pattern": "####"}), ("zero_variance", {})])
    groups, m = bonus_first([g])
    assert len(groups) == 1 and m["ops/zero_variance/dropped_groups"] == 0
    filter_first = ExperiencePipeline([("zero_variance", {}), ("format_bonus", {"pattern": "####"})])
    groups, m = filter_first([g])
    assert groups == [] and m["ops/format_bonus/kept"] == 0
    assert filter_first.names() == ["zero_variance", "format_bonus"]


def scale_by_group_size(groups, factor=1.0):
    return [[e.replace(reward=e.reward * factor * len(g)) for e in g] for g in groups]


def test_a_user_operator_by_module_path_and_by_registration():
    g = [exp(1.0), exp(0.5)]
    groups, m = ExperiencePipeline([(f"{__name__}:scale_by_group_size", {"factor": 0.5})])([g])
    assert [e.reward for e in groups[0]] == [1.0, 0.5]  # r * 0.5 * 2
    assert m["ops/scale_by_group_size/changed"] == 2  # new objects are changed, whatever their reward
    with EXPERIENCE_OPS.snapshot():
        EXPERIENCE_OPS.register("mine")(scale_by_group_size)
        groups, m = ExperiencePipeline([("mine", {"factor": 2.0}), ("mine", {})])([g])
        assert [e.reward for e in groups[0]] == [8.0, 4.0]
        assert {"ops/mine/changed", "ops/mine_1/changed"} <= set(m)
    assert "mine" not in EXPERIENCE_OPS


def test_unknown_operators_and_arguments_name_the_entry():
    with pytest.raises(KeyError, match=r"zero_varience.*did you mean 'zero_variance'"):
        ExperiencePipeline([("zero_varience", {})])
    with pytest.raises(TypeError, match=r"experience_ops\[1\].*unknown args \['bonuss'\]"):
        ExperiencePipeline([("zero_variance", {}), ("format_bonus", {"pattern": "x", "bonuss": 1})])


def test_every_builtin_operator_has_a_test_here():
    judged = Path(__file__).parents[1] / "rewards" / "test_judges.py"  # "ruler", beside its judge server
    source = Path(__file__).read_text() + judged.read_text()
    untested = [name for name in EXPERIENCE_OPS.names() if f'"{name}"' not in source]
    assert not untested
