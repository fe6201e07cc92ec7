"""Reflect and retry (``reflect_retry``): failed episodes are diagnosed and retried from their mistake.

An R3L-style workflow (Shi et al. 2026, arXiv:2601.03715) over the step-wise one (one experience per model
turn, ``workflow: step_wise``). A task's ``repeat_times`` episodes are played as usual; then each episode whose
return is below ``retry_below`` is *reflected on*: its environment's ``diagnose`` names the turn that went
wrong and how to recognise the same mistake (``envs.base.Diagnosis``). The *retry* replays the episode's
turns before that one in a fresh environment (the same tokens; the environment must answer them as before),
samples the failed turn ``candidates`` times from the same prompt in one call, keeps the first sample that
does not repeat the mistake, and plays on from there like any episode. What the trainer gets:

- the retry, from its pivot turn on, as an extra episode of the task's group (``run_index`` after the
  others), each turn rewarded with the return from it, so a retry that reaches the goal gives its turns
  positive advantages next to the failed attempt's negative ones;
- pivotal credit: when the retry succeeds (return >= ``retry_below``), the turns the failed episode and its
  retry share (before the pivot) are dropped from the failed episode's experiences: they led to success
  too, so only the diverging suffixes carry the contrast (``pivotal_credit: false`` keeps them);
- positive amplification is the advantage's: ``advantage_args: {positive_scale: 2}`` on ``step_wise_grpo``.

What differs from the paper: the diagnosis comes from the environment (FrozenLake's walks the moves over
the map), not from the policy writing a reflection in words; and the retry's first turn is steered by
rejecting samples that repeat the mistake rather than by the reflection placed in its context. A
model-written reflection (generate a diagnosis, put it in the retry's prompt, strip it from the trained
context) is not built. The retry's first turn is therefore drawn from the policy restricted to the other
moves, an off-policy sample whose log-probs are the policy's own.

Metrics: a base episode's experiences carry ``reflect/failed`` and ``reflect/retried`` (0/1); a retry's carry
its episode metrics under ``retry/`` (``retry/success``, ``retry/turns``, ...) so the step's rollout success
stays the base episodes' own. Retries that could not be made (no diagnosis, every candidate repeating the
mistake, a replay that came out differently) are logged and counted in ``reflect/not_retried`` on the failed
episode. Evaluate with ``multi_turn`` or ``step_wise`` (an eval taskset's own ``workflow``): retries are
training data, not a score.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from trivium.envs.base import Diagnosis
from trivium.envs.calls import call_with_timeout
from trivium.models.handle import ModelHandle
from trivium.types import Experience, Task
from trivium.workflows.multi_turn import (
    Episode,
    StepWiseWorkflow,
    prompt_images,
    require_stable_template,
)
from trivium.workflows.registry import register_workflow

log = logging.getLogger(__name__)

__all__ = ["ReflectRetryWorkflow"]


@register_workflow("reflect_retry")
class ReflectRetryWorkflow(StepWiseWorkflow):
    """Step-wise episodes, failed ones diagnosed and retried from the mistake (see the module docstring).

    Extra args: ``candidates`` (samples of the retried turn, the first that avoids the mistake is kept),
    ``retry_below`` (an episode with a lower return is retried), ``max_retries`` (per task, the first failed
    episodes; None: every one), ``pivotal_credit`` (drop the shared prefix from a failed episode whose retry
    succeeded), and the ``step_wise`` args (``discount``, ``env``, ``env_args``, ``max_turns``, ...).
    """

    keeps_generations = True

    def __init__(
        self,
        candidates: int = 4,
        retry_below: float = 1.0,
        max_retries: int | None = None,
        pivotal_credit: bool = True,
        **args: Any,
    ):
        super().__init__(**args)
        if isinstance(candidates, bool) or not isinstance(candidates, int) or not 1 <= candidates <= 64:
            raise ValueError(f"workflow_args.candidates must be an integer from 1 to 64, got {candidates!r}")
        if isinstance(retry_below, bool) or not isinstance(retry_below, (int, float)):
            raise ValueError(f"workflow_args.retry_below must be a number (a return), got {retry_below!r}")
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
        ):
            raise ValueError(
                f"workflow_args.max_retries must be an integer >= 0 or null, got {max_retries!r}"
            )
        if not isinstance(pivotal_credit, bool):
            raise ValueError(f"workflow_args.pivotal_credit must be true or false, got {pivotal_credit!r}")
        self.candidates = candidates
        self.retry_below = float(retry_below)
        self.max_retries = max_retries
        self.pivotal_credit = pivotal_credit

    def run(self, task: Task, model: ModelHandle) -> list[Experience]:
        require_stable_template(model.tokenizer, self.allow_unstable_template)
        episodes = [self._start(task, model, i) for i in range(model.params.n)]
        self._play(task, model, episodes)
        ok = self._finished(task, episodes)
        failed = [e for e in ok if sum(e.rewards) < self.retry_below]
        for e in ok:
            below = sum(e.rewards) < self.retry_below
            e.metrics.update(
                {"reflect/failed": float(below), "reflect/retried": 0.0, "reflect/not_retried": 0.0}
            )
        plans = []
        for e in failed[: self.max_retries]:
            diagnosis = self._diagnose(task, e)
            if diagnosis is not None:
                plans.append((e, diagnosis))
        retries = self._retry(task, model, plans, first_run=len(episodes))
        return [x for e in [*ok, *retries] for x in self.experiences(task, e)]

    def _diagnose(self, task: Task, e: Episode) -> Diagnosis | None:
        actions = [g.text for g in e.generations]
        try:
            d = call_with_timeout(
                e.env.diagnose, actions, timeout_s=self.env_timeout_s, what=f"{self.env_name}.diagnose"
            )
            if d is not None and not isinstance(d, Diagnosis):
                raise TypeError(f"{type(e.env).__name__}.diagnose returned {type(d).__name__}, not Diagnosis")
            if d is not None and not 0 <= d.turn < len(actions):
                raise ValueError(
                    f"Diagnosis.turn {d.turn} is not one of the episode's turns 0..{len(actions) - 1}"
                )
        except Exception as exc:
            log.warning("task %s run %d: diagnose failed, not retried: %r", task.task_id, e.run_index, exc)
            self._not_retried(task, e, f"diagnose failed: {exc!r}")
            return None
        if d is None:
            self._not_retried(task, e, "no diagnosis")
        return d

    def _not_retried(self, task: Task, e: Episode, why: str) -> None:
        e.metrics["reflect/not_retried"] = 1.0
        log.debug("task %s run %d not retried: %s", task.task_id, e.run_index, why)

    def _retry(
        self, task: Task, model: ModelHandle, plans: Sequence[tuple[Episode, Diagnosis]], first_run: int
    ) -> list[Episode]:
        """Replay each plan's prefix in a fresh environment, sample its pivot turn avoiding the mistake (one
        model call for all of them), then play the retries to the end together."""
        ready: list[tuple[Episode, Episode, Diagnosis]] = []
        for j, (base, d) in enumerate(plans):
            retry = self._start(task, model, first_run + j)
            why = self._replay(task, model, retry, base, d.turn)
            if why:
                self._abandon(retry)
                self._not_retried(task, base, why)
                log.warning(
                    "task %s run %d: the retry could not be made: %s", task.task_id, base.run_index, why
                )
                continue
            ready.append((base, retry, d))
        if not ready:
            return []
        media = [prompt_images(r.transcript) for _, r, _ in ready]
        candidates = model.generate_many(
            [r.transcript.ids for _, r, _ in ready], media=media if any(media) else None, n=self.candidates
        )
        playing = []
        for (base, retry, d), samples in zip(ready, candidates):
            failed_text = base.generations[d.turn].text
            repeats = d.repeats or (lambda text, failed=failed_text: text.strip() == failed.strip())
            chosen = next((g for g in samples if not repeats(g.text)), None)
            if chosen is None:
                self._abandon(retry)
                self._not_retried(task, base, f"all {len(samples)} candidates repeat the mistake")
                continue
            retry.first_turn = d.turn
            retry.info.update({"retry_of": base.run_index, "pivot": d.turn, "feedback": d.feedback})
            base.metrics["reflect/retried"] = 1.0
            self._take_turn(task, retry, chosen, model)
            playing.append((base, retry))
        self._play(task, model, [r for _, r in playing])
        out = []
        for base, retry in playing:
            if retry.reason == "error":
                base.metrics["reflect/retried"] = 0.0
                self._not_retried(task, base, f"the retry failed: {retry.error}")
                continue
            if self.pivotal_credit and sum(retry.rewards) >= self.retry_below:
                base.first_turn = retry.first_turn
            out.append(retry)
        return out

    def _abandon(self, retry: Episode) -> None:
        """Close the environment of a retry that will not be played (a finished one is closed already)."""
        if not retry.done:
            retry.done, retry.reason = True, "abandoned"
            self._close(retry)

    def _replay(self, task: Task, model: ModelHandle, retry: Episode, base: Episode, turns: int) -> str:
        """Put ``base``'s first ``turns`` model turns into ``retry`` (a fresh episode); '' or why it failed."""
        if retry.reason == "error":
            return f"reset failed: {retry.error}"
        for k, gen in enumerate(base.generations[:turns]):
            if retry.done:
                return f"the replayed episode ended at turn {k} (the original went on)"
            if retry.transcript.ids != list(gen.prompt_ids):
                return f"the environment answered differently on replay (before turn {k})"
            self._take_turn(task, retry, gen, model)
        if retry.done:
            return f"the replayed episode ended before turn {turns}: {retry.reason} {retry.error}".strip()
        if retry.state != base.turn_states[turns]:
            return f"the environment answered differently on replay (before turn {turns})"
        return ""

    def episode_metrics(self, e: Episode) -> dict[str, float]:
        metrics = super().episode_metrics(e)
        if "retry_of" in e.info:  # the base episodes' metrics (rollout success) stay their own
            return {f"retry/{k}": v for k, v in metrics.items()}
        return metrics
