"""The AgentScope example (examples/agentscope): a real AgentScope ReAct agent against a real endpoint.

A tiny random model shows that whatever the model says, an episode ends with a reward and its calls
become trainable experiences; a scripted model (fixed replies, real server and AgentScope) walks the
tool-call round trip, which a random model almost never produces.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from trivium.models.protocol import Generation, SamplingParams
from trivium.serve.openai_server import OpenAIServer
from trivium.serve.recorder import Recorder, RecordingSession
from trivium.tasks.agent_tasks import calculator_rows
from trivium.tools import TOOLS, format_tool_call
from trivium.types import Task

pytest.importorskip("agentscope")
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "agentscope" / "agentscope.yaml"
AGENT = "examples.agentscope.agent:calculator_agent"  # workflow_args.agent in the config
KEY = "test-key"
DEFAULTS = SamplingParams(max_tokens=24, include_stop_str_in_output=False)
TASK = Task("calc:0", {"question": "Compute 816 + 196.", "answer": "1012"}, "openai_agent", "math_verify")


@dataclasses.dataclass
class API:
    """What the openai_agent workflow hands an agent (its AgentAPI), around a recording session."""

    base_url: str
    api_key: str
    model: str
    run_index: int
    session: RecordingSession

    def client(self, **kwargs: Any):
        return self.session.client(**kwargs)

    def async_client(self, **kwargs: Any):
        return self.session.async_client(**kwargs)


def api_for(recorder: Recorder, run_index: int = 0) -> API:
    session = recorder.session()
    return API(session.base_url, KEY, "policy", run_index, session)


@pytest.fixture(scope="module")
def example():
    """The example module, imported by its dotted path with the repository root on the import path (what
    ``PYTHONPATH=.`` does for ``trivium run``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        yield importlib.import_module(AGENT.partition(":")[0])


@pytest.fixture(scope="module")
def engine(tmp_path_factory, example):
    from trivium.models.tiny import make_tiny
    from trivium.models.transformers_engine import TransformersEngine

    rows = calculator_rows(200, seed=0)
    corpus = [example.SYSTEM_PROMPT, json.dumps(TOOLS.get("calculator").schema()["function"])]
    corpus += [r["question"] for r in rows] + [f"#### {r['answer']}" for r in rows]
    corpus += [format_tool_call("calculator", {"expression": r["expression"]}) for r in rows]
    path = make_tiny(
        tmp_path_factory.mktemp("agentscope") / "tiny",
        corpus,
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        seed=0,
    )
    return TransformersEngine.from_pretrained(path, seed=0)


class Scripted:
    """A rollout model that replies with the next of ``texts`` (the real engine's tokenizer and context)."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.version, self.texts = engine, engine.tokenizer, 0, []

    def generate(self, prompts, params):
        text = self.texts.pop(0)
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        logprobs = tuple(-0.01 * (k + 1) for k in range(len(ids)))
        return [[Generation(tuple(prompts[0]), tuple(ids), logprobs, "eos", text)]]


def serve(model):
    return OpenAIServer(
        model,
        model_name="policy",
        recorder=Recorder(default_session=None),
        api_key=KEY,
        default_params=DEFAULTS,
    )


@pytest.fixture(scope="module")
def server(engine):
    with serve(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def scripted(engine):
    model = Scripted(engine)
    with serve(model) as srv:
        yield model, srv


def test_an_episode_on_a_random_tiny_model_ends_with_a_reward_and_trainable_calls(example, server):
    api = api_for(server.recorder, run_index=3)
    reward, metrics = example.calculator_agent(TASK, api)
    assert isinstance(reward, float) and reward in (0.0, 1.0)
    assert metrics["refused"] in (0.0, 1.0) and "tool_calls" in metrics

    calls = api.session.calls
    assert len(calls) >= 1
    for call in calls:  # AgentScope sent no sampling parameters: the run's defaults were used
        assert call.params == dataclasses.asdict(DEFAULTS)
    steps = api.session.experiences(reward, mode="step", task_id=TASK.task_id, run_index=3)
    assert len(steps) == len(calls)
    for exp, call in zip(steps, calls):
        assert exp.tokens.tolist() == [*call.prompt_ids, *call.response_ids]
        assert exp.prompt_length == len(call.prompt_ids) and len(call.response_ids) >= 1
        assert exp.action_mask.dtype == torch.bool and bool(exp.action_mask.all())
        assert exp.logprobs.tolist() == pytest.approx(list(call.logprobs), abs=1e-6)
        assert exp.reward == reward and exp.task_id == TASK.task_id and exp.run_index == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_round_trip_is_continued_token_for_token(example, scripted, stream):
    model, srv = scripted
    model.texts = [format_tool_call("calculator", {"expression": "816 + 196"}), "So #### 1012"]
    api = api_for(srv.recorder)
    reward, metrics = example.calculator_agent(TASK, api, stream=stream)
    assert reward == 1.0 and metrics["tool_calls"] == 1.0 and metrics["refused"] == 0.0

    first, second = api.session.calls
    assert first.finish_reason == "tool_calls" and first.tool_calls[0]["function"]["name"] == "calculator"
    assert second.prefix_reused and second.continued_call_id == first.call_id  # the message names dropped
    (episode,) = api.session.experiences(reward, mode="concat")
    between = episode.tokens[episode.prompt_length :][~episode.action_mask].tolist()
    assert "<tool_response>\n1012\n</tool_response>" in model.tokenizer.decode(between)
    assert episode.action_mask.sum() == len(first.response_ids) + len(second.response_ids)


def test_a_refused_request_ends_the_episode_with_reward_zero(example, scripted):
    """The second call does not fit the model's context: the endpoint answers 400, the episode ends."""
    model, srv = scripted
    model.texts = ["7 " * 600 + format_tool_call("calculator", {"expression": "816 + 196"})]
    api = api_for(srv.recorder)
    reward, metrics = example.calculator_agent(TASK, api)
    assert reward == 0.0 and metrics["refused"] == 1.0
    assert (
        metrics["error"].startswith("BadRequestError: messages: the prompt has")
        and "context" in metrics["error"]
    )
    assert len(api.session.calls) == 1 and len(api.session.experiences(reward, mode="step")) == 1


def test_the_config_and_its_real_model_recipe_validate(example):
    """The CPU config and the ``--set`` overrides of its header (the real-model recipe) are valid configs;
    the agent's dotted path is imported by the workflow's check (the data files need not exist)."""
    from trivium.validation import load_config

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        cpu = load_config(CONFIG, check_files=False)
        recipe = re.findall(r"--set (\S+)", CONFIG.read_text())
        real = load_config(CONFIG, overrides=recipe, check_files=False)
    (stage,) = cpu.stages
    taskset = stage.config.buffer.taskset
    assert taskset.workflow == "openai_agent" and taskset.workflow_args["agent"] == AGENT
    assert stage.config.model.tiny is not None
    assert "model.tiny=null" in recipe and real.stages[0].config.model.tiny is None
    assert real.stages[0].config.model.path == "Qwen/Qwen2.5-1.5B-Instruct"
