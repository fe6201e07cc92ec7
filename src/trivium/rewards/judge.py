"""Judged rewards: ``llm_judge`` (a 0..1 score from a judge prompt) and ``rubric`` (rubric items, each judged
yes or no, weighted), from a model behind any OpenAI-compatible URL (Trivium's own endpoint included).

    reward_fn: llm_judge
    reward_args: {url: "http://127.0.0.1:8000/v1", model: judge, api_key_env: JUDGE_API_KEY}

- The API key is read from the environment variable named by ``api_key_env`` (never from the config); an
  empty name sends no key.
- Calls go through the ``openai`` client. Answers are judged concurrently as the workflows score them (each
  task in its own thread); ``max_concurrency`` bounds the calls in flight to one URL across the run.
- Parsed verdicts are cached per (url, model, judge prompt), and the prompt holds the question and the
  answer, so a repeated (question, answer) pair is judged once (bounded: the oldest of ``CACHE_SIZE``
  entries go first). Two threads judging the same new pair at once may both call the judge.
- A reply without a score is asked again (``retries`` more times, at temperature 0 the same prompt may
  well give the same reply: raise ``temperature`` to vary it), then scored 0 and counted in
  ``count/judge_unparsable``. A call that fails (HTTP error, timeout) after the client's own retries
  raises, which the reward guard scores 0 and counts in ``count/reward_error``.

``llm_judge``: the reply's last number, divided by ``scale`` (10 for a 0-10 judge), must lie in [0, 1].
``rubric``: items from ``data["rubric"]`` when the task has them, else ``reward_args.rubric``: a list of
``{criterion, weight}`` (or plain strings, weight 1); each is asked as a yes/no question about the answer;
the reward is the weight of the items judged "yes" over the total weight.

``ruler`` (a whole group of answers ranked in one call) is an experience operator, since the reward seam
scores one answer: rewards/ruler.py, on the same client, cache and concurrency bound.

In process: ``model_path`` instead of ``url`` (a local model folder, or a Hugging Face id when online) loads
the judge into this process with Trivium's engine on ``device`` / ``dtype`` and serves it on 127.0.0.1 with
Trivium's own OpenAI-compatible endpoint (started on first use, one per (path, device, dtype), for the
process's lifetime); everything else is the same path as a remote judge.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trivium.rewards.registry import RewardResult, register_reward

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_SIZE",
    "JUDGE_ARGS",
    "JUDGE_PROMPT",
    "RUBRIC_PROMPT",
    "JudgeSettings",
    "check_judge_args",
    "clear_cache",
    "local_judge_url",
    "parse_score",
    "parse_yes_no",
]

CACHE_SIZE = 100_000
JUDGE_PROMPT = (
    "Rate the answer to the question from 0 to 1 (1: fully correct and helpful).\n"
    "Question: {question}\nReference answer: {reference}\nAnswer: {answer}\n"
    "Reply with the score only."
)
RUBRIC_PROMPT = (
    "Question: {question}\nAnswer: {answer}\n"
    "Does the answer satisfy this criterion: {criterion}\nReply yes or no."
)
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_cache: OrderedDict[tuple[str, str, str, str], Any] = OrderedDict()
_cache_lock = threading.Lock()
_limits: dict[str, threading.BoundedSemaphore] = {}
_clients: dict[tuple[str, str, float], Any] = {}


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def parse_score(reply: str, scale: float = 1.0) -> float | None:
    """The reply's last number over ``scale``, if it lies in [0, 1]; else None."""
    numbers = _NUMBER.findall(reply)
    if not numbers:
        return None
    value = float(numbers[-1]) / scale
    return value if 0.0 <= value <= 1.0 else None


def parse_yes_no(reply: str) -> float | None:
    words = re.findall(r"[a-z]+", reply.lower())
    if not words or words[0] not in ("yes", "no"):
        return None
    return 1.0 if words[0] == "yes" else 0.0


def _client(url: str, api_key_env: str, timeout_s: float):
    import openai

    key = (url, api_key_env, timeout_s)
    if key not in _clients:
        api_key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not api_key:
            raise ValueError(
                f"reward_args.api_key_env names {api_key_env!r}, which is not set in the environment: "
                "export it before the run"
            )
        _clients[key] = openai.OpenAI(
            base_url=url, api_key=api_key or "none", timeout=timeout_s, max_retries=2
        )
    return _clients[key]


@dataclass(frozen=True)
class JudgeSettings:
    """Where a judge model is and how to call it: the settings ``llm_judge``, ``rubric`` and ``ruler``
    share. Their config args are these plus their own (prompt, scale, ...); ``JudgeSettings.from_args``
    takes a judge's ``**judge`` keyword arguments, with that judge's defaults."""

    url: str = ""  # the judge's OpenAI-compatible base URL, e.g. http://host:8000/v1
    model_path: str = ""  # instead of url: a model folder (or HF id) served in this process
    device: str = "cpu"  # the in-process judge's device and dtype
    dtype: str = "float32"
    model: str = "judge"  # the model name sent with each call
    api_key_env: str = ""  # the environment variable holding the API key ("": no key sent)
    retries: int = 2  # how often an unparsable reply is asked again
    timeout_s: float = 60.0
    max_concurrency: int = 8  # calls in flight to one URL, across the run
    temperature: float = 0.0
    max_tokens: int = 16  # the judge's reply length (not the policy's: the judge's own default)

    @classmethod
    def from_args(cls, args: Mapping[str, Any], **defaults: Any) -> JudgeSettings:
        """Settings from a judge's keyword arguments over ``defaults`` (a judge's own, e.g. max_tokens)."""
        unknown = sorted(set(args) - set(JUDGE_ARGS))
        if unknown:
            raise TypeError(f"unknown judge setting(s) {unknown}; valid: {', '.join(JUDGE_ARGS)}")
        merged = {**defaults, **args}
        for name, kind in (("timeout_s", float), ("temperature", float)):
            if name in merged:
                merged[name] = kind(merged[name])
        return cls(**merged)

    def base_url(self) -> str:
        """The URL calls go to: ``url``, or the in-process judge's (started on first use)."""
        if self.model_path:
            return local_judge_url(self.model_path, self.model, self.device, self.dtype)
        return self.url

    def ask(self, prompt: str) -> str:
        """The judge's reply to ``prompt`` (one call, at most ``max_concurrency`` in flight per URL)."""
        url = self.base_url()
        limit = _limits.setdefault(url, threading.BoundedSemaphore(self.max_concurrency))
        with limit:
            reply = _client(url, self.api_key_env, self.timeout_s).chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt}],
                temperature=self.temperature,
                max_tokens=self.max_tokens,
            )
        return reply.choices[0].message.content or ""

    def verdict(self, prompt: str, parse: Callable[[str], Any], kind: str) -> tuple[Any, int]:
        """The parsed verdict (None: unparsable after the retries) and how many retries it took. Only
        parsed verdicts are cached, keyed by (url, model, how the reply is read, prompt)."""
        key = (self.base_url(), self.model, kind, prompt)
        with _cache_lock:
            if key in _cache:
                _cache.move_to_end(key)
                return _cache[key], 0
        for attempt in range(self.retries + 1):
            value = parse(self.ask(prompt))
            if value is not None:
                with _cache_lock:
                    _cache[key] = value
                    while len(_cache) > CACHE_SIZE:
                        _cache.popitem(last=False)
                return value, attempt
        return None, self.retries


JUDGE_ARGS = tuple(f.name for f in fields(JudgeSettings))


def takes_judge_settings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a judge whose ``**judge`` collects the ``JudgeSettings`` args: the registries' check of
    unknown config keys (``registry.part_args``) then knows them."""
    fn.more_args = JUDGE_ARGS  # type: ignore[attr-defined]
    return fn


_local: dict[tuple[str, str, str], Any] = {}
_local_lock = threading.Lock()


def local_judge_url(
    model_path: str, model: str = "judge", device: str = "cpu", dtype: str = "float32"
) -> str:
    """The ``.../v1`` URL of ``model_path`` served in this process on 127.0.0.1 by Trivium's own endpoint,
    started on first use (one per (path, device, dtype)) and kept for the process's lifetime."""
    key = (str(model_path), str(device), str(dtype))
    with _local_lock:
        server = _local.get(key)
        if server is None:
            from trivium.models.batching import BatchingRolloutModel
            from trivium.models.transformers_engine import TransformersEngine
            from trivium.serve.openai_server import OpenAIServer

            engine = TransformersEngine.from_pretrained(model_path, device=device, dtype=dtype, seed=0)
            server = OpenAIServer(BatchingRolloutModel(engine), model_name=model, drive_batches=True).start()
            _local[key] = server
            log.info(
                "judge %s (%s, %s) served in this process at %s", model_path, device, dtype, server.base_url
            )
        return server.base_url


def check_judge_args(args: Mapping[str, Any], where: str = "reward_args") -> None:
    """``ValueError`` naming ``where.<key>`` for a judge's bad url, counts or prompt."""
    url, path = args.get("url"), args.get("model_path")
    if path:
        if url:
            raise ValueError(f"{where}: give the judge's url or its model_path (served in process), not both")
        if not isinstance(path, str) or (not Path(path).is_dir() and not _HUB_ID.fullmatch(path)):
            raise ValueError(
                f"{where}.model_path must be a model folder (or a Hugging Face id when online), got {path!r}: "
                "no such folder"
            )
    elif not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(
            f"{where}.url must be the judge's http(s) base URL (e.g. http://host:8000/v1), got {url!r}; or "
            "give model_path to serve a local judge model in this process"
        )
    for key, low in (("max_concurrency", 1), ("retries", 0), ("max_tokens", 1)):
        value = args.get(key, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{where}.{key} must be an integer >= {low}, got {value!r}")
    for key in ("prompt",):
        if key in args and not isinstance(args[key], str):
            raise ValueError(f"{where}.{key} must be text, got {args[key]!r}")


def _fields(response: str, data: Mapping[str, Any]) -> dict[str, str]:
    return {
        "question": str(data.get("question", "")),
        "reference": str(data.get("answer", "")),
        "answer": response,
    }


@register_reward("llm_judge", check_args=check_judge_args)
@takes_judge_settings
def llm_judge_reward(
    response: str, data: Mapping[str, Any], prompt: str = JUDGE_PROMPT, scale: float = 1.0, **judge: Any
) -> RewardResult:
    """A 0..1 score: the judge's reply to ``prompt`` (its last number) divided by ``scale``; ``judge``:
    the ``JudgeSettings`` (url or model_path, model, ...)."""
    settings = JudgeSettings.from_args(judge, max_tokens=16)
    text = prompt.format(**_fields(response, data))
    score, tries = settings.verdict(text, lambda r: parse_score(r, scale), f"score/{scale}")
    metrics = {"count/judge_unparsable": float(score is None), "count/judge_retries": float(tries)}
    return RewardResult(score or 0.0, {"judge_score": score or 0.0, **metrics})


def _items(data: Mapping[str, Any], rubric: Sequence[Any] | None) -> list[tuple[str, float]]:
    items = data.get("rubric", rubric)
    out = []
    for item in items or ():
        if isinstance(item, str):
            out.append((item, 1.0))
        elif isinstance(item, Mapping) and isinstance(item.get("criterion"), str):
            out.append((item["criterion"], float(item.get("weight", 1.0))))
        else:
            raise ValueError(f"a rubric item is a string or {{criterion, weight}}, got {item!r:.80}")
    if not out or sum(w for _, w in out) <= 0:
        raise ValueError("the rubric reward needs rubric items (task field 'rubric' or reward_args.rubric)")
    return out


@register_reward("rubric", check_args=check_judge_args, task_fields=("rubric",))
@takes_judge_settings
def rubric_reward(
    response: str,
    data: Mapping[str, Any],
    rubric: Sequence[Any] | None = None,
    prompt: str = RUBRIC_PROMPT,
    **judge: Any,
) -> RewardResult:
    """The weight of the rubric items the judge says yes to, over the total weight (the module's docstring);
    ``judge``: the ``JudgeSettings``."""
    settings = JudgeSettings.from_args(judge, max_tokens=4)
    items, fields = _items(data, rubric), _fields(response, data)
    got = unparsable = tries = 0.0
    for criterion, weight in items:
        verdict, n = settings.verdict(prompt.format(**fields, criterion=criterion), parse_yes_no, "yes_no")
        got += weight * (verdict or 0.0)
        unparsable += verdict is None
        tries += n
    score = got / sum(w for _, w in items)
    metrics = {"count/judge_unparsable": unparsable, "count/judge_retries": tries}
    return RewardResult(score, {"judge_score": score, **metrics})
