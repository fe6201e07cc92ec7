"""Serve mode: the policy answers live traffic, the traffic becomes training data, rewards come later.

    trivium run -c cfg.yaml --set mode=serve &     # endpoint; records every call, reward empty
    curl -X POST $URL/feedback -d '{"id": "chatcmpl-...", "reward": 1.0}'   # minutes or days later
    trivium run -c cfg.yaml --set mode=train       # trains on rewarded calls only, publishes weights

One process serves the OpenAI-compatible endpoint (``openai_server.py``) over the current policy. Every
call (chat or completion, through ``/v1`` or a session) is written, before its response is returned,
into the run's SQL buffer as *pending* experiences: one per choice, in the ``step`` layout (prompt ids,
then the sampled ids with the engine's log-probs; ``task_id`` the call id, ``run_index`` the choice,
reward NaN). A pending experience is never read by a trainer. ``POST /feedback`` attaches a reward to a
call (all its choices, or one) and makes its experiences ready in one transaction; the separate ``train``
process (``launch/decoupled.py``, the same config with ``mode: train``) claims only ready experiences,
exactly once, trains, and publishes weights versions (``synchronizer.method: checkpoint``). A thread of
this process looks for a newer version every ``serve.poll_interval_s`` and loads it into the engine in
place (between batches), so ``/health``, responses and recorded calls carry the new version.

Design decisions:
- The call id (the response's ``id``) is the key of feedback: clients already hold it, and it is the
  ``task_id`` column of the buffer (indexed). ``POST /feedback`` with ``{"id", "reward", "choice"?,
  "info"?}``: 200 ``{"id", "ready": n, "experience_ids"}``; an unknown id or choice is 404; a reward is
  attached once, a second one for the same experience is 409 (the first may already be trained on;
  "last wins" could not take it back); a body that is not ``{id: str, reward: finite number, ...}`` is
  400, and so is a reward outside ``[serve.reward_min, serve.reward_max]`` (default ±1e6: one reward of
  1e308 would dominate every advantage of its batch). ``info`` (any JSON object) is kept in the
  experiences' ``info["feedback"]``.
- Groups: the ``n`` choices of one call share a ``group_id`` (a hash of the call id), so a client that
  asks for ``n > 1`` and rewards each choice gets group-relative advantages (GRPO); single-choice traffic
  forms groups of one, which have no baseline (GRPO: A = R; the trainer warns, and check-config says so).
  For it use an algorithm with a batch-wide baseline: ``algorithm_type: reinforceplusplus``. Groups are not completed before training: a FIFO batch
  may cut a call's choices apart when their rewards arrive at different times.
- Off-policy by design: feedback may come long after the call, and the trainer meanwhile publishes newer
  weights. Experiences keep the version that sampled them; ``synchronizer.max_staleness`` drops (or
  keeps, counted) the stale ones, and ``algorithm.rollout_is_cap`` corrects the ratio.
- Sampling defaults come from ``explorer.rollout`` (temperature, top_p, top_k, max_tokens, stop), which is
  what the trainer assumes when it recomputes log-probs; a request that sets its own temperature gets
  log-probs at that temperature (kept in ``info["params"]``), which the trainer's ratio does not know.
- The default session is replaced after ``serve.keep_calls`` calls, so a long-running server holds a
  bounded number of transcripts in memory (the buffer holds every call).
- ``serve.json`` in the run folder says where the server listens (written once it accepts requests,
  removed on a clean exit). SIGTERM and SIGINT stop it gracefully: requests in flight finish and are
  recorded, then the buffer is closed.

Left out: feedback by session (reward every call of an agent run at once: send one request per call
id), streaming feedback in bulk, and expiry of never-rewarded calls (they stay pending in the buffer).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from trivium.files import write_atomically
from trivium.serve.recorder import RecordedCall, Recorder

if TYPE_CHECKING:
    from trivium.types import Experience

__all__ = [
    "SERVE_FILE",
    "CallWriter",
    "FeedbackRequest",
    "WeightFollower",
    "feedback_route",
    "serve",
    "served_experiences",
]

log = logging.getLogger(__name__)

SERVE_FILE = "serve.json"


class FeedbackRequest(BaseModel):
    """The body of ``POST /feedback``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(min_length=1, max_length=255)
    """The ``id`` of the response (call) being rewarded."""
    reward: float = Field(allow_inf_nan=False)
    """The reward of that call (a finite number)."""
    choice: int | None = Field(None, ge=0)
    """Reward only this choice (``choices[i].index``); default: every choice of the call."""
    info: dict[str, Any] | None = None
    """Anything else to keep with the experiences (``info["feedback"]``), e.g. who rated and why."""


def served_experiences(call: RecordedCall) -> list[Experience]:
    """The pending experiences of ``call``: one per choice, reward NaN, task id = call id."""
    from trivium.serve.experiences import step_experiences

    group = int.from_bytes(hashlib.blake2b(call.call_id.encode(), digest_size=7).digest(), "big")
    params = {k: call.params.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens")}
    out = step_experiences(call.session_id or "", [call], reward=math.nan, task_id=call.call_id, run_index=0)
    return [
        e.replace(
            run_index=e.info["choice"], group_id=group, info={**e.info, "kind": call.kind, "params": params}
        )
        for e in out
    ]


class CallWriter:
    """The recorder's ``on_call``: writes each call as pending experiences (key ``serve:{call id}``), and
    replaces the default session every ``keep_calls`` calls so that memory stays bounded."""

    def __init__(self, storage, keep_calls: int):
        self.storage = storage
        self.keep_calls = keep_calls
        self.recorder: Recorder | None = None
        self.written = 0
        self._lock = threading.Lock()

    def __call__(self, call: RecordedCall) -> None:
        self.storage.write(served_experiences(call), key=f"serve:{call.call_id}", pending=True)
        with self._lock:
            self.written += 1
            rotate = self.recorder is not None and self.written % self.keep_calls == 0
            if rotate:
                old = self.recorder.default
                self.recorder.default = self.recorder.session(f"default-{self.written}", {"default": True})
                if old is not None:
                    old.close()


def feedback_route(storage, reward_min: float = -1e6, reward_max: float = 1e6):
    """``POST /feedback``: attach a reward to a recorded call; see the module docstring for the answers."""
    from trivium.buffer.storage import RewardConflict, UnknownExperience
    from trivium.serve.schemas import RequestError

    def feedback(body: FeedbackRequest) -> dict[str, Any]:
        if not reward_min <= body.reward <= reward_max:
            raise RequestError(
                f"reward: {body.reward!r} is outside [{reward_min:g}, {reward_max:g}] (serve.reward_min, "
                "serve.reward_max); scale the reward into that range",
                param="reward",
            )
        which = "every choice" if body.choice is None else f"choice {body.choice}"
        try:
            ids = storage.attach_reward(body.id, body.reward, run_index=body.choice, info=body.info)
        except UnknownExperience:
            param = "id" if body.choice is None else "choice"
            raise RequestError(
                f"no recorded call {body.id!r} with {which}: send the 'id' of a response of this server "
                "(and a choice index it returned, or no choice)",
                param=param,
                status=404,
            ) from None
        except RewardConflict:
            raise RequestError(
                f"call {body.id!r} ({which}) already has a reward; a reward is attached once, because the "
                "trainer may already have trained on the first. Nothing was changed",
                param="id",
                status=409,
                kind="conflict",
            ) from None
        log.info(
            "feedback: call %s (%s) rewarded %s, %d experience(s) ready",
            body.id,
            which,
            body.reward,
            len(ids),
        )
        return {"id": body.id, "ready": len(ids), "experience_ids": ids}

    return ("/feedback", feedback, ["POST"])


class WeightFollower(threading.Thread):
    """Loads every newer published weights version into the serving model, every ``interval_s``."""

    def __init__(self, sync, model, interval_s: float):
        super().__init__(name="serve-weights", daemon=True)
        self.sync, self.model, self.interval_s = sync, model, interval_s
        self.stopping = threading.Event()
        self._last_error = ""

    def poll(self) -> int | None:
        """Load the newest version if it is newer than the model's; returns it, or None. Never raises: a
        version pruned while loading is tried again at the next poll (a repeated error is logged once)."""
        t0 = time.perf_counter()
        try:
            version = self.sync.pull(self.model)
        except Exception as error:
            if repr(error) != self._last_error:
                log.exception(
                    "loading newer weights (synchronizer.method %s) failed; still serving version %d, trying "
                    "again every %.1f s",
                    type(self.sync).__name__,
                    self.model.version,
                    self.interval_s,
                )
            self._last_error = repr(error)
            return None
        self._last_error = ""
        if version is not None:
            log.info("serving weights version %d (loaded in %.2f s)", version, time.perf_counter() - t0)
        return version

    def health(self) -> dict[str, Any]:
        """What ``/health`` says of the weights: the version served, and whether the last look for a newer
        one failed (the served weights are good either way: a version is checked, finite and by checksum,
        before it replaces them)."""
        return {
            "version": self.model.version,
            "healthy": not self._last_error,
            "last_error": self._last_error or None,
        }

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)


def serve(cfg, run_dir: Path, policy=None, tokenizer=None, stop: threading.Event | None = None) -> None:
    """Run mode serve until SIGTERM/SIGINT (or ``stop`` is set); ``policy``/``tokenizer``: the loaded
    starting model (loaded from ``model.path`` when None). A newer published version replaces it at once."""
    from trivium.launch import build
    from trivium.launch.placement import placement_of
    from trivium.serve.limits import ServeLimits
    from trivium.serve.openai_server import OpenAIServer
    from trivium.sync.protocol import build_weight_sync
    from trivium.validation.validate import config_notes

    for note in config_notes(cfg):
        log.warning("%s", note)
    if policy is None:
        policy, tokenizer = build.load_policy(build.ensure_model(cfg, run_dir), cfg)
    s = cfg.serve
    # explorer.rollout picks the engine (transformers or vllm) and its dtype; nothing trains the policy in
    # this process, so the in-process engine takes it over instead of copying it.
    model = placement_of(cfg).rollout_engine(policy, tokenizer, cfg, version=0, weights="take")
    follower = WeightFollower(
        build_weight_sync(cfg, run_dir, "rollout", engine=model), model, s.poll_interval_s
    )
    follower.poll()  # start from the newest published version, if any
    storage = build.storage(cfg, run_dir)
    writer = CallWriter(storage, s.keep_calls)
    recorder = Recorder(on_call=writer)
    writer.recorder = recorder
    server = OpenAIServer(
        model,
        model_name=s.model_name or cfg.name,
        recorder=recorder,
        api_key=os.environ.get(s.api_key_env) if s.api_key_env else None,
        default_params=_default_params(cfg),
        host=s.host,
        port=s.port,
        extra_routes=[feedback_route(storage, s.reward_min, s.reward_max)],
        limits=ServeLimits.from_config(s),
        drive_batches=True,
        health_info=lambda: {"weights": follower.health()},
    )
    stop = stop or threading.Event()
    info_file = run_dir / SERVE_FILE
    info_file.unlink(missing_ok=True)
    restore = _stop_on_signals(stop)
    try:
        try:
            server.start()
        except OSError as error:
            raise RuntimeError(
                f"serve.host/serve.port: cannot listen on {s.host}:{s.port} ({error}); pick a free port, or "
                "port 0 to let the system choose one (serve.json in the run folder then says which)"
            ) from error
        follower.start()
        write_atomically(
            info_file, json.dumps(_serve_info(server, s.model_name or cfg.name, model.version), indent=1)
        )
        log.info(
            "serving %s at %s (weights version %d); feedback: POST %s/feedback",
            cfg.name,
            server.base_url,
            model.version,
            server.url,
        )
        stop.wait()
        log.info("stopping the server: %d call(s) recorded", writer.written)
    finally:
        info_file.unlink(missing_ok=True)
        server.stop()
        if follower.is_alive():
            follower.stop()
        storage.close()
        restore()


def _default_params(cfg):
    from trivium.models.protocol import SamplingParams

    r = cfg.explorer.rollout
    return SamplingParams(
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        stop=tuple(r.stop),
        include_stop_str_in_output=False,
    )


def _serve_info(server, model_name: str, version: int) -> dict[str, Any]:
    return {
        "url": server.url,
        "base_url": server.base_url,
        "feedback_url": f"{server.url}/feedback",
        "host": server.host,
        "port": server.port,
        "model": model_name,
        "pid": os.getpid(),
        "started": time.time(),
        "version_at_start": version,
    }


def _stop_on_signals(stop: threading.Event):
    """SIGTERM and SIGINT set ``stop`` (main thread only); returns the function that restores the old
    handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        log.info("got %s", signal.Signals(signum).name)
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
