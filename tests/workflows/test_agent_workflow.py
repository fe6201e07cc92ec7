"""The openai_agent workflow: a user's agent talks to the recording endpoint through the explorer."""

import pytest
import torch
from tests.workflows import agents_for_tests

from trivium.explorer.explorer import Explorer
from trivium.models.batching import BatchingRolloutModel
from trivium.models.protocol import SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.types import Task


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return BatchingRolloutModel(TransformersEngine.from_pretrained(tiny_model_dir, seed=0))


def tasks(n, agent="tests.workflows.agents_for_tests:calculator_agent", **args):
    return [
        Task(
            f"calc:{i}",
            {"question": f"What is {i} + 2?", "answer": str(i + 2)},
            "openai_agent",
            "math_verify",
            repeat_times=2,
            workflow_args={"agent": agent, **args},
        )
        for i in range(n)
    ]


def run(engine, ts, records=None):
    params = SamplingParams(temperature=1.0, max_tokens=12)
    explorer = Explorer(
        engine,
        rollout_params=params,
        eval_params=params,
        failure_sink=(records if records is not None else []).append,
    )
    return explorer.run_tasks(ts, params, use_repeat_times=True)


def test_concurrent_agents_get_their_own_sessions_and_exact_tokens(engine):
    agents_for_tests.SEEN.clear()
    results = run(engine, tasks(3))
    assert all(r.error is None for r in results)
    urls = [url for _, _, url in agents_for_tests.SEEN]
    assert len(urls) == 6 and len(set(urls)) == 6  # 3 tasks x 2 runs, one session each
    for r in results:
        runs = {e.run_index for e in r.experiences}
        assert runs == {0, 1} and all(e.task_id == r.task.task_id for e in r.experiences)
        for e in r.experiences:
            assert e.action_mask.all() and e.prompt_length >= 1
            # The experience's log-probs are the engine's: recompute them teacher-forced.
            model = engine.engine.model
            with torch.no_grad():
                logits = model(e.tokens.unsqueeze(0)).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(1, e.tokens[1:].unsqueeze(1)).squeeze(1)
            assert torch.allclose(lp[e.prompt_length - 1 :], e.logprobs, atol=1e-4)
            assert e.metrics["calls"] >= 1


def test_concat_mode_merges_a_run_into_one_experience(engine):
    results = run(engine, tasks(1, mode="concat"))
    (r,) = results
    assert len(r.experiences) == 2 and {e.run_index for e in r.experiences} == {0, 1}


def test_an_agent_without_model_calls_fails_its_runs_and_is_recorded(engine):
    records = []
    with pytest.raises(RuntimeError, match="every task of the batch failed"):
        run(engine, tasks(1, agent="tests.workflows.agents_for_tests:silent_agent"), records)
    assert records and "no model call" in records[0]["reason"]


def test_a_bad_agent_path_is_a_clear_error():
    from trivium.registry import UnknownPartError
    from trivium.workflows.agent import OpenAIAgentWorkflow

    with pytest.raises(UnknownPartError, match="cannot import module 'no_such_package'"):
        OpenAIAgentWorkflow(agent="no_such_package:agent")
    with pytest.raises(
        UnknownPartError, match=r"looks like a dotted path: write it as 'package\.module:name'"
    ):
        OpenAIAgentWorkflow(agent="no_such_package.agent")
