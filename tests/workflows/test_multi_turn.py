"""Multi-turn workflows with a real tiny engine and scripted environments: exact tokens, masks, rewards."""

import pytest
import torch

from trivium.algorithm.advantages import AdvantageInputs
from trivium.algorithm.registry import ADVANTAGE_FNS
from trivium.models.handle import ModelHandle
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.types import Task, collate
from trivium.workflows.multi_turn import ConcatenatedMultiTurnWorkflow, StepWiseWorkflow

ENV = "tests.workflows.conftest:CountdownEnv"  # imported by path, like a user's own environment


class RecordingEngine:
    """The real engine, with every generate call's prompts and outputs kept for the assertions."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.max_length, self.eos_ids = engine.max_length, engine.eos_ids

    tokenizer = property(lambda self: self.engine.tokenizer)
    version = property(lambda self: self.engine.version)

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        self.calls.append((prompts, out))
        return out


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return TransformersEngine.from_pretrained(tiny_model_dir, seed=0)


def task(n=7):
    return Task(
        task_id=f"t{n}", data={"n": n}, workflow="multi_turn", reward_fn="exact_match", repeat_times=2
    )


def handle(engine, n=2):
    rec = RecordingEngine(engine)
    return rec, ModelHandle(rec, SamplingParams(n=n, temperature=1.0, max_tokens=8))


def test_three_turn_episode_holds_exactly_the_engine_tokens(engine):
    rec, h = handle(engine)
    exps = ConcatenatedMultiTurnWorkflow(env=ENV, env_args={"turns": 3}).run(task(), h)
    assert len(exps) == 2 and len(rec.calls) == 3  # both episodes step together: one call per turn
    for run, exp in enumerate(exps):
        assert exp.run_index == run and exp.reward == 1.0 and exp.metrics["turns"] == 3
        tokens = exp.tokens.tolist()
        # Every call's prompt is the transcript so far, byte for byte, and its sample follows it.
        for prompts, out in rec.calls:
            prompt, gen = prompts[run], out[run][0]
            assert tokens[: len(prompt)] == prompt
            assert tokens[len(prompt) : len(prompt) + len(gen.response_ids)] == list(gen.response_ids)
        # The action mask is True exactly on sampled tokens, with the engine's log-probs there.
        sampled = [t for _, out in rec.calls for t in out[run][0].response_ids]
        logps = [lp for _, out in rec.calls for lp in out[run][0].logprobs]
        response = exp.tokens[exp.prompt_length :]
        assert response[exp.action_mask].tolist() == sampled
        assert torch.allclose(exp.logprobs[exp.action_mask], torch.tensor(logps))
        assert (exp.logprobs[~exp.action_mask] == 0).all()
        # What is not sampled is the environment's turns as the template renders them.
        text = engine.tokenizer.decode(response[~exp.action_mask].tolist())
        assert "left: 2" in text and "left: 1" in text and "<|user|>" in text


def test_step_wise_gives_one_experience_per_turn_with_returns(engine):
    rec, h = handle(engine)
    exps = StepWiseWorkflow(env=ENV, env_args={"turns": 3, "step_rewards": True}).run(task(), h)
    assert len(exps) == 6
    by_run = {r: sorted([e for e in exps if e.run_index == r], key=lambda e: e.turn) for r in (0, 1)}
    for run, steps in by_run.items():
        assert [e.turn for e in steps] == [0, 1, 2]
        assert [e.reward for e in steps] == [0.75, 0.5, 0.25]  # return from each turn on
        for turn, e in enumerate(steps):
            prompts, out = rec.calls[turn]
            assert e.tokens[: e.prompt_length].tolist() == prompts[run]
            assert e.tokens[e.prompt_length :].tolist() == list(out[run][0].response_ids)
            assert e.action_mask.all()
    # Each turn records the state it started from: the countdown shows both episodes the same observations.
    states = [[e.info["state"] for e in steps] for steps in by_run.values()]
    assert states[0] == states[1] and len(set(states[0])) == 3
    batch = collate([e.replace(group_id=0) for e in exps], pad_token_id=0)
    assert batch.states.tolist() == [[0, 1, 2][e.turn] for e in exps]
    adv, metrics = ADVANTAGE_FNS.get("step_wise_grpo")(AdvantageInputs.from_batch(batch))
    # Both episodes earned the same return: no signal between them, whatever the per-turn returns.
    assert metrics["advantage/episodes"] == 2 and (adv == 0).all()
    adv, metrics = ADVANTAGE_FNS.get("gigpo")(AdvantageInputs.from_batch(batch))
    assert metrics["gigpo/anchor_groups"] == 3 and (adv == 0).all()  # equal returns from each state too
    # The concatenated workflow keeps no per-turn states: its batches have none.
    assert collate(ConcatenatedMultiTurnWorkflow(env=ENV).run(task(), h), pad_token_id=0).states is None


def test_step_wise_grpo_compares_episodes_not_turns():
    # Episode 0: two turns, return 1; episodes 1-3: one, three and one turns, return 0.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    runs, turns = torch.tensor([0, 0, 1, 2, 2, 2, 3]), torch.tensor([0, 1, 0, 0, 1, 2, 0])
    mask = torch.ones(7, 2, dtype=torch.bool)
    seq = torch.arange(7).unsqueeze(1).expand(7, 2)
    inputs = AdvantageInputs(rewards, torch.zeros(7, dtype=torch.long), mask, seq, run_ids=runs, turns=turns)
    adv, _ = ADVANTAGE_FNS.get("step_wise_grpo")(inputs)
    # GRPO over the episode returns [1, 0, 0, 0] (docs/algorithms.md §4): 1.499997 and -0.499999 per turn.
    expected = torch.tensor([1.499997, 1.499997, -0.499999, -0.499999, -0.499999, -0.499999, -0.499999])
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    with pytest.raises(ValueError, match="run_ids"):
        ADVANTAGE_FNS.get("step_wise_grpo")(
            AdvantageInputs(rewards, torch.zeros(7, dtype=torch.long), mask, seq)
        )


def test_an_environment_that_raises_or_hangs_fails_its_episode_only(engine):
    _, h = handle(engine, n=3)
    wf = ConcatenatedMultiTurnWorkflow(
        env=ENV, env_args={"turns": 2, "fail_on": 0, "hang_on": 2}, env_timeout_s=0.5
    )
    exps = wf.run(task(), h)
    assert [e.run_index for e in exps] == [1]
    reasons = dict(wf.failed_runs)
    assert "environment exploded" in reasons[0] and "env_timeout_s=0.5" in reasons[2]


def test_max_turns_ends_the_episode_as_truncated(engine):
    _, h = handle(engine, n=1)
    (exp,) = ConcatenatedMultiTurnWorkflow(env=ENV, env_args={"turns": 5}, max_turns=2).run(task(), h)
    assert exp.metrics["turns"] == 2 and exp.metrics["truncated"] == 1.0 and exp.reward == 0.0
    assert exp.info["end"] == "max_turns"


def test_unstable_template_is_refused_unless_allowed(tiny_model_dir):
    from tests.workflows.test_transcript import STRIPPING_TEMPLATE

    from trivium.models.chat import TemplateError

    engine = TransformersEngine.from_pretrained(tiny_model_dir, seed=0)
    engine.tokenizer.chat_template = STRIPPING_TEMPLATE
    _, h = handle(engine, n=1)
    with pytest.raises(TemplateError, match="allow_unstable_template"):
        ConcatenatedMultiTurnWorkflow(env=ENV).run(task(), h)
    (exp,) = ConcatenatedMultiTurnWorkflow(env=ENV, allow_unstable_template=True).run(task(), h)
    assert exp.metrics["turns"] == 3
