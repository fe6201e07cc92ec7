"""``ruler``: a judge model scores a whole group of answers to one task against each other, in one call.

RULER (Relative Universal LLM-Elicited Rewards, OpenPipe's ART, 2025) rests on two observations: a judge
ranks answers to the same task far more reliably than it grades one answer on an absolute scale, and
GRPO-style advantages only use the differences between the rewards of a group anyway. So the judge sees the
task and the group's N answers, numbered, and gives each a score in [0, 1] relative to the others; no
reference answer and no hand-written reward are needed.

A group exists only after every answer of a task is sampled, so RULER is an experience operator, not a
per-answer reward (the reward seam scores one answer, rewards/registry.py); buffer/judged_ops.py registers
it as one:

    buffer:
      experience_ops:
        - name: ruler
          args: {url: "http://127.0.0.1:8000/v1", model: judge, api_key_env: JUDGE_API_KEY}

The workflow's own ``reward_fn`` still runs first (a cheap rule, or a constant); ``ruler`` then replaces each
reward with ``weight * score`` (``add: true`` adds it to the workflow's reward instead).

- ``model_path`` instead of ``url`` serves a local judge model in this process (rewards/judge.py).
- The task shown to the judge is the last user message of the answer's chat (``info["messages"]``, kept by
  the single-turn workflows); the answers are ``info["response"]``.
- Groups are judged concurrently (``max_concurrency`` calls in flight per URL across the run, shared with
  ``llm_judge`` and ``rubric``); a parsed ranking is cached per (url, model, prompt).
- The reply must give a score for every answer (``1: 0.8`` lines or a JSON list of N numbers, each in
  [0, 1] after dividing by ``scale``). A reply that does not is asked again (``retries``), then the group
  keeps its rewards and counts in ``ops/ruler/unparsable_groups``; a call that fails (HTTP error, timeout)
  keeps the group's rewards too, counted in ``ops/ruler/failed_groups`` and logged. The step never fails
  because of the judge.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trivium.rewards.judge import JudgeSettings, check_judge_args, takes_judge_settings
from trivium.types import Experience

__all__ = ["RULER_PROMPT", "parse_ranking", "ruler"]

log = logging.getLogger(__name__)
Groups = list[list[Experience]]  # an experience operator's input and output (buffer/operators.py)

RULER_PROMPT = (
    "Below are a task and {n} candidate answers to it. Score each answer from 0 to 1 relative to the "
    "others: the best near 1, the worst near 0, equally good answers equally.\n\n"
    "Task:\n{question}\n\n{answers}\n"
    'Reply with one line per answer, "<answer number>: <score>", and nothing else.'
)
_LINE = re.compile(r"^\W*(?:answer\s*)?(\d+)\s*[:=)\-]\s*(-?\d+(?:\.\d+)?)", re.I | re.M)


def parse_ranking(reply: str, n: int, scale: float = 1.0) -> list[float] | None:
    """The N scores of a judge's reply (``k: score`` lines, or a JSON list of N numbers), each over
    ``scale`` and in [0, 1]; None when an answer has no score, a number repeats, or a score is out of range."""
    scores: list[float] | None = None
    text = reply.strip()
    if text.startswith("["):
        try:
            values = json.loads(text)
        except ValueError:
            values = None
        if isinstance(values, list) and len(values) == n and all(isinstance(v, (int, float)) for v in values):
            scores = [float(v) for v in values]
    if scores is None:
        found: dict[int, float] = {}
        for number, value in _LINE.findall(reply):
            k = int(number)
            if k in found or not 1 <= k <= n:
                return None
            found[k] = float(value)
        if sorted(found) != list(range(1, n + 1)):
            return None
        scores = [found[k] for k in range(1, n + 1)]
    scores = [s / scale for s in scores]
    return scores if all(0.0 <= s <= 1.0 for s in scores) else None


def _question(e: Experience) -> str:
    messages = e.info.get("messages") or ()
    users = [m.get("content", "") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _prompt(group: list[Experience], template: str) -> str:
    answers = "".join(f"Answer {i}:\n{e.info.get('response', '')}\n\n" for i, e in enumerate(group, 1))
    return template.format(n=len(group), question=_question(group[0]), answers=answers)


def _check(args: Mapping[str, Any]) -> None:
    check_judge_args(args, "the ruler operator's args")
    if "scale" in args and not (isinstance(args["scale"], (int, float)) and args["scale"] > 0):
        raise ValueError(f"the ruler operator's args.scale must be a positive number, got {args['scale']!r}")


@takes_judge_settings
def ruler(
    groups: Groups,
    prompt: str = RULER_PROMPT,
    scale: float = 1.0,
    weight: float = 1.0,
    add: bool = False,
    **judge: Any,
) -> tuple[Groups, dict[str, float]]:
    """Each group's rewards from one judge call ranking its answers (the module's docstring); ``judge``:
    the ``JudgeSettings`` (a ranking reply is long: max_tokens 256 unless set). Its args are checked once,
    by the pipeline that runs it (``_check``)."""
    settings = JudgeSettings.from_args(judge, max_tokens=256)

    def judge(group: list[Experience]) -> tuple[str, list[float] | None]:
        try:
            scores, _ = settings.verdict(
                _prompt(group, prompt), lambda r: parse_ranking(r, len(group), scale), "rank"
            )
        except Exception as exc:  # an HTTP error or timeout after the client's retries
            log.warning(
                "ruler: the judge call for task %r failed (%s); its rewards stay", group[0].task_id, exc
            )
            return "failed", None
        return ("judged" if scores is not None else "unparsable"), scores

    ranked = [g for g in groups if len(g) > 1]  # a group of one has nothing to be ranked against
    with ThreadPoolExecutor(max_workers=max(1, min(settings.max_concurrency, len(ranked)))) as pool:
        verdicts = dict(zip(map(id, ranked), pool.map(judge, ranked), strict=True))
    counts = dict.fromkeys(("judged_groups", "unparsable_groups", "failed_groups"), 0.0)
    out: Groups = []
    for group in groups:
        how, scores = verdicts.get(id(group), (None, None))
        if how is not None:
            counts[f"{how}_groups"] += 1
        if scores is None:
            out.append(group)
        else:
            out.append(
                [e.replace(reward=weight * s + (e.reward if add else 0.0)) for e, s in zip(group, scores)]
            )
    return out, counts


ruler.check_args = _check  # type: ignore[attr-defined]
