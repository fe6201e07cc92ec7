"""Train any agent that talks to an OpenAI-compatible API: its calls are recorded into experiences.

``workflow: openai_agent`` with ``workflow_args.agent: package.module:function`` (or a name registered
with ``register_agent``) runs the user's agent
once per run of a task. The agent gets an ``AgentAPI``: a base URL (and key, model name, ready clients)
of the rollout model's endpoint, bound to a recording session of its own. Every call it makes is
sampled by the rollout model and recorded with its exact token ids and log-probs (the endpoint continues
a conversation token for token when the agent sends the history back); the agent returns its reward, and
the session's calls become experiences:

- ``mode: step`` (default): one experience per call, all rewarded with the episode reward (group them
  with ``step_wise_grpo``: each call carries its run index and turn).
- ``mode: concat``: the calls of a run merged into one experience (the tokens between calls masked);
  fails when the agent rewrote its history between calls.

Signature of the agent: ``agent(task: Task, api: AgentAPI) -> float | tuple[float, dict]`` (reward, and
numeric metrics that are averaged into the rollout metrics). It runs in a thread; async frameworks
call ``asyncio.run`` inside it. Runs of one task run concurrently; concurrent runs never share a session.

The endpoint is started once per rollout model and sampling setup (rollout or eval), on 127.0.0.1 and a
free port, and stays up for the process. Its defaults are the run's sampling parameters: an agent that
leaves temperature and max_tokens unset samples exactly as configured (the trainer assumes
``explorer.rollout.temperature``; an agent that sets its own temperature trains on mismatched log-probs).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from trivium.models.handle import ModelHandle
from trivium.models.protocol import SamplingParams
from trivium.registry import Registry, callable_part
from trivium.types import Experience, Task
from trivium.workflows.base import Workflow
from trivium.workflows.registry import register_workflow

__all__ = ["AGENTS", "AgentAPI", "OpenAIAgentWorkflow", "endpoint_for", "register_agent"]

MODEL_NAME = "policy"


@dataclass
class AgentAPI:
    """What an agent needs to reach the rollout model; everything it sends is recorded for this run."""

    base_url: str  # OpenAI-compatible, ends in /v1
    api_key: str
    model: str  # the name to pass as `model` (any name is accepted)
    run_index: int
    session: Any  # trivium.serve.recorder.RecordingSession

    def client(self, **kwargs: Any):
        """An ``openai.OpenAI`` bound to this run's session (retries off: a retry would record twice)."""
        return self.session.client(**kwargs)

    def async_client(self, **kwargs: Any):
        return self.session.async_client(**kwargs)


_ENDPOINTS: dict[tuple[int, SamplingParams], Any] = {}
_ENDPOINTS_LOCK = threading.Lock()


def endpoint_for(model: Any, params: SamplingParams):
    """The (started) ``OpenAIServer`` over ``model`` with ``params`` as defaults; one per pair, reused."""
    from trivium.serve.openai_server import OpenAIServer
    from trivium.serve.recorder import Recorder

    key = (id(model), dataclasses.replace(params, n=1))
    with _ENDPOINTS_LOCK:
        server = _ENDPOINTS.get(key)
        if server is None:
            server = OpenAIServer(
                model, model_name=MODEL_NAME, recorder=Recorder(default_session=None), default_params=key[1]
            ).start()
            _ENDPOINTS[key] = server
        return server


AGENTS: Registry[Callable[[Task, AgentAPI], Any]] = Registry(
    "agent", doc="fn(task: Task, api: AgentAPI) -> reward | (reward, metrics)", check=callable_part
)


def register_agent(name: str):
    """Decorator: register an agent function under ``name`` (``workflow_args.agent: name``)."""
    return AGENTS.register(name)


@register_workflow("openai_agent")
class OpenAIAgentWorkflow(Workflow):
    """Run ``agent`` (a registered name or ``module:function``) against a recording endpoint; see the
    module docstring."""

    reads_all_columns: ClassVar[bool] = True  # the agent reads whatever it needs from the row

    def __init__(
        self,
        agent: str,
        mode: Literal["step", "concat"] = "step",
        agent_args: Mapping[str, Any] | None = None,
    ):
        if mode not in ("step", "concat"):
            raise ValueError(f"workflow_args.mode={mode!r} must be 'step' or 'concat'")
        self.agent = AGENTS.get(agent)
        self.agent_path = agent
        self.mode = mode
        self.agent_args = dict(agent_args or {})
        self.failed_runs: list[tuple[int, str]] = []

    def run(self, task: Task, model: ModelHandle) -> list[Experience]:
        server = endpoint_for(model.rollout_model, model.params)
        runs = model.params.n
        with ThreadPoolExecutor(max_workers=runs, thread_name_prefix="agent") as pool:
            results = list(pool.map(lambda run: self._episode(task, server, run), range(runs)))
        self.failed_runs = [(run, error) for run, (_, error) in enumerate(results) if error]
        out = [e for exps, _ in results for e in exps]
        if not out:
            raise RuntimeError(
                f"every run of agent {self.agent_path} on task {task.task_id} failed: {results[0][1]}"
            )
        return out

    def _episode(self, task: Task, server: Any, run: int) -> tuple[list[Experience], str]:
        session = server.recorder.session(metadata={"task_id": task.task_id, "run_index": run})
        try:
            api = AgentAPI(session.base_url, server.api_key or "EMPTY", MODEL_NAME, run, session)
            result = self.agent(task, api, **self.agent_args)
            reward, metrics = result if isinstance(result, tuple) else (result, {})
            if not session.calls:
                return [], "the agent made no model call"
            experiences = session.experiences(
                float(reward), mode=self.mode, task_id=task.task_id, run_index=run
            )
            extra = {k: float(v) for k, v in dict(metrics).items() if isinstance(v, (int, float, bool))}
            return [
                e.replace(turn=k if self.mode == "step" else 0, metrics={**e.metrics, **extra})
                for k, e in enumerate(experiences)
            ], ""
        except Exception as exc:  # this run fails, the task's other runs go on
            return [], f"{type(exc).__name__}: {exc}"
        finally:
            session.close()
