"""Sample strategies: rollouts plus expert demonstrations (CHORD), and their config checks."""

import warnings

import pytest
import torch

from trivium.buffer.sampling import (
    SAMPLE_STRATEGIES,
    SampleContext,
    SampleStrategy,
    build_strategy,
    problems_of,
)
from trivium.config import ConfigError
from trivium.config.schema import TriviumConfig
from trivium.models.loading import load_tokenizer
from trivium.types import Experience
from trivium.validation import validate_raw


def rollout(group, version=3):
    return Experience(
        tokens=torch.tensor([1, 2, 3]),
        prompt_length=1,
        action_mask=torch.ones(2, dtype=torch.bool),
        logprobs=torch.zeros(2),
        reward=1.0,
        group_id=group,
        model_version=version,
    )


def test_mix_adds_marked_demonstrations_in_fresh_groups(tiny_model_dir, word_problem_dir):
    cfg = TriviumConfig(
        buffer={
            "expert_per_step": 3,
            "expert_dataset": {
                "path": str(word_problem_dir / "sft.jsonl"),
                "fields": {"prompt": "question", "response": "answer"},
            },
        }
    )
    context = SampleContext.from_config(cfg, load_tokenizer(tiny_model_dir))
    assert (context.batch_size, context.repeat_times, context.expert_per_step) == (
        cfg.buffer.batch_size,
        1,
        3,
    )
    strategy = SAMPLE_STRATEGIES.get("mix")(context)
    batch = strategy([rollout(5), rollout(5), rollout(7)], step=4)
    assert len(batch) == 6
    demos = batch[3:]
    assert all(e.is_expert and e.model_version == 3 and e.explore_step == 4 for e in demos)
    assert [e.group_id for e in demos] == [8, 9, 10]
    assert not any(e.is_expert for e in batch[:3])
    assert SAMPLE_STRATEGIES.get("default")(context)([rollout(1)], step=0)[0].group_id == 1


def test_config_checks_the_strategy(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"question": "q", "answer": "1"}\n')
    raw = {
        "model": {"path": "Qwen/Qwen2.5-0.5B"},
        "buffer": {"taskset": {"path": "t.jsonl"}},
        "algorithm": {"algorithm_type": "mix_chord"},
    }
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, tmp_path)
    assert {p.path for p in info.value.problems} == {"buffer.expert_dataset", "buffer.expert_per_step"}
    raw["algorithm"] = {"algorithm_type": "grpo", "sample_strategy": "mixx"}
    with pytest.raises(ConfigError, match="did you mean 'mix'"):
        validate_raw(raw, tmp_path)


class _OldForm(SampleStrategy):
    """A user's strategy written for the first form of the seam: (cfg, tokenizer, **args)."""

    def __init__(self, cfg, tokenizer, keep: int = 1):
        self.keep = keep
        self.batch_size = cfg.buffer.batch_size

    @classmethod
    def problems(cls, cfg, args):
        return (
            [] if args.get("keep", 1) > 0 else [("algorithm.sample_strategy_args", "keep >= 1", "raise keep")]
        )

    def __call__(self, rollouts, step):
        return list(rollouts)[: self.keep]


def test_a_strategy_of_the_first_form_still_builds_with_a_deprecation_warning():
    cfg = TriviumConfig(buffer={"batch_size": 4})
    with pytest.warns(
        DeprecationWarning, match=r"_OldForm takes \(cfg, tokenizer, \*\*args\).*SampleContext"
    ):
        strategy = build_strategy(_OldForm, cfg, None, {"keep": 2})
    assert strategy.batch_size == 4 and len(strategy([rollout(1)] * 3, step=1)) == 2
    with pytest.warns(DeprecationWarning):
        assert problems_of(_OldForm, cfg, {"keep": 0})[0][0] == "algorithm.sample_strategy_args"
    with warnings.catch_warnings():  # the new form warns nothing
        warnings.simplefilter("error")
        build_strategy(SampleStrategy, cfg, None, {})
        assert problems_of(SAMPLE_STRATEGIES.get("mix"), cfg, {})[0][0] == "buffer.expert_dataset"
