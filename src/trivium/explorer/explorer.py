"""The explorer: runs workflows over tasks with the rollout model and hands experiences to the buffer.

Workflows of one step run concurrently in threads; each is a registered worker of the batching rollout
model, so their model calls are sampled in one batch (as many prompts as tasks in flight). The explorer
stamps what a workflow cannot know: the group id (one per task per step), the model version (the oldest
weights that sampled one of its tokens, ``sampled_by``) and the step. A workflow that raises fails its task only; the failure is counted and logged with the task id.
Robustness knobs: ``max_retries`` re-runs a failed task (a fresh workflow and environments) up to that many
more times; ``workflow_timeout_s`` stops a run at its next model call once it is over time (environment
steps have their own timeout, see envs/calls.py). Every failure, of a task or of one episode inside it,
goes to ``failure_sink`` (the run folder's ``failures.jsonl``) with task id, run and reason.

Fault injection (``faults``, a ``trivium.faults.FaultInjector``; off unless the config's ``faults``
section sets a rate): each attempt of a task runs in a fault scope keyed by its step, place, task id and
attempt; the workflow site is here, before the workflow runs. Injected failures take the path of real ones;
their records list what was injected (``injected``), and ``faults/*`` counts them per step.
``in_flight()`` says which tasks run now and for how long (the stall doctor reads it).

Long-tail control (docs/agents.md): ``timeouts`` gives each task its limit (``explorer.dynamic_timeout``:
a multiple of the recent mean task time), enforced at model calls and around environment calls; with
``over_rollout_ratio`` > 1 a step starts more tasks than it needs and cancels the stragglers once enough
finished (``run_tasks(enough=...)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from trivium import faults as fault_sites
from trivium.buffer.task_files import TaskDataError
from trivium.envs.calls import hung_calls, task_deadline
from trivium.explorer.step_metrics import StepTally, TaskResult, at_k, duration_metrics, summarize
from trivium.explorer.timeouts import TaskTimeouts
from trivium.faults import FaultInjector
from trivium.models.handle import ModelHandle, PromptTooLong, WorkflowTimeoutError
from trivium.models.protocol import SamplingParams, TaskCancelled
from trivium.monitor.phases import PEAK_RSS
from trivium.threads import map_in_helpers
from trivium.types import Experience, Task
from trivium.workflows.registry import get_workflow

log = logging.getLogger(__name__)


class LongRowError(TaskDataError):
    """A task's prompt fills the model's context and its task set says ``on_long_row: error``."""

    def __init__(self, task: Task, cause: PromptTooLong):
        super().__init__(
            f"task set {task.taskset!r} row {task.index} (task {task.task_id}): {cause}, and the task set has "
            "on_long_row: error. Shorten the row or use a model with a longer context, or set the task "
            "set's on_long_row: skip (drop such rows, counted in skipped_long_tasks) or truncate (cut the "
            "prompt's oldest tokens, counted in truncated_prompts)"
        )


def sampled_by(experience: Experience, step_version: int) -> int:
    """The experience's weights version: the oldest that sampled one of its tokens where the engine said
    (``info["token_versions"]``), else the version when the step began. Not simply the latter: a sync can
    land between the step's start and a sample's first token (an explorer running ahead of the trainer),
    and a sample stamped older than its weights would count as stale (the staleness filter, M2PO)."""
    known = [int(v) for v, n in experience.info.get("token_versions") or () if int(v) >= 0 and int(n) > 0]
    return min(known) if known else step_version


class Explorer:
    def __init__(
        self,
        model,  # BatchingRolloutModel: generate(prompts, params, order_key=...), worker(), version
        *,
        rollout_params: SamplingParams,
        eval_params: SamplingParams,
        taskset=None,  # TaskSetReader or None (eval only)
        eval_tasksets: Sequence = (),
        queue=None,  # ExperienceQueue or None (eval only)
        batch_size: int = 1,
        max_concurrency: int = 0,
        dynamic_sampling: bool = False,
        max_sampling_rounds: int = 10,
        max_retries: int = 0,
        workflow_timeout_s: float = 0.0,
        timeouts: TaskTimeouts | None = None,  # each task's limit (explorer.dynamic_timeout); default: fixed
        over_rollout_ratio: float = 1.0,  # start ceil(ratio x needed) tasks, go ahead once needed finished
        over_rollout_wait_s: float = 0.0,  # ... and no sooner than this after the round started
        failure_sink: Callable[[dict], None] | None = None,
        faults: FaultInjector | None = None,
        experience_ops=None,  # buffer.operators.ExperiencePipeline or None
    ):
        self.model = model
        self.rollout_params = rollout_params
        self.eval_params = eval_params
        self.taskset = taskset
        self.eval_tasksets = list(eval_tasksets)
        self.queue = queue
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.dynamic_sampling = dynamic_sampling
        self.max_sampling_rounds = max_sampling_rounds
        self.max_retries = max_retries
        self.timeouts = timeouts or TaskTimeouts(workflow_timeout_s)
        if over_rollout_ratio < 1:
            raise ValueError(f"explorer.over_rollout.ratio must be >= 1, got {over_rollout_ratio}")
        self.over_rollout_ratio = over_rollout_ratio
        self.over_rollout_wait_s = over_rollout_wait_s
        self.failure_sink = failure_sink  # gets one dict per failure (task id, run, attempt, reason)
        self.next_group_id = 0
        self.failed_tasks = 0
        self.faults = faults
        if experience_ops is None and dynamic_sampling:  # the old flag alone: DAPO's zero-variance filter
            from trivium.buffer.operators import ExperiencePipeline

            experience_ops = ExperiencePipeline([("zero_variance", {})])
        self.experience_ops = experience_ops
        self._phase = "explore"  # written into failure records: "explore:<step>" or "eval"
        self._in_flight: dict[int, tuple[str, float]] = {}  # thread id -> (task id, monotonic start)
        self._in_flight_lock = threading.Lock()

    def state_dict(self) -> dict:
        """Task-set position, group-id counter and the engine's sampling RNG (for exact resume)."""
        return {
            "taskset": None if self.taskset is None else self.taskset.state_dict(),
            "next_group_id": self.next_group_id,
            "sampler": self.model.engine.sampler_state(),
            "task_seconds": self.timeouts.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if self.taskset is not None and state["taskset"] is not None:
            self.taskset.load_state_dict(state["taskset"])
        self.next_group_id = state["next_group_id"]
        self.model.engine.load_sampler_state(state["sampler"])
        self.timeouts.load_state_dict(state.get("task_seconds", []))  # (not in checkpoints before it)

    def explore_step(self, step: int) -> dict[str, float]:
        """``_explore_step``, with its peak memory as ``rss/rollout`` when ``monitor.phase_memory`` is on."""
        peak: dict[str, float] = {}
        with PEAK_RSS.phase(peak, "rollout"):
            metrics = self._explore_step(step)
        return {**metrics, **peak}

    def _explore_step(self, step: int) -> dict[str, float]:
        """Run one batch of tasks, write their experiences to the queue, return rollout metrics.

        Each round's groups pass the experience operators (``experience_ops``, buffer/operators.py), which
        may drop or reshape them. With dynamic sampling (DAPO), more tasks are sampled until ``batch_size``
        groups are kept, or the step fails after ``max_sampling_rounds`` extra rounds. Every task's rollouts
        are reported to the task set (``observe``: adaptive selectors learn from them).
        ``rollout/experiences`` says how many reached the queue (fewer than batch_size x repeat_times when
        tasks failed); ``rollout/informative_groups`` of ``rollout/groups`` had some reward variance.
        """
        t0 = time.perf_counter()
        engine_s0 = getattr(self.model, "engine_seconds", 0.0)
        self._phase = f"explore:{step}"
        tally = StepTally(version=self.model.version)
        kept = self._sample_groups(step, tally)
        experiences = [e for group in kept[: self.batch_size] for e in group]
        tally.unused = max(0, len(kept) - self.batch_size)  # finished beyond the batch (task order kept)
        seconds = time.perf_counter() - t0
        engine_seconds = getattr(self.model, "engine_seconds", 0.0) - engine_s0
        t1 = time.perf_counter()
        self.queue.put(experiences)
        return self._step_metrics(tally, len(experiences), seconds, engine_seconds, time.perf_counter() - t1)

    def _sample_groups(self, step: int, tally: StepTally) -> list[list[Experience]]:
        """Rounds of tasks until ``batch_size`` groups pass the experience operators (one round unless
        dynamic sampling is on); each task's experiences become one group, stamped with this step."""
        kept: list[list[Experience]] = []
        while True:
            need = self.batch_size - len(kept)
            started = math.ceil(self.over_rollout_ratio * need)  # over-rollout: more, and go ahead at need
            tasks = self.taskset.next_batch(started)
            enough = need if started > need else None
            results = self.run_tasks(tasks, self.rollout_params, use_repeat_times=True, enough=enough)
            tally.count(tasks, results)
            kept += self._pass_operators(self._groups_of(results, step, tally), tally)
            if not self.dynamic_sampling or len(kept) >= self.batch_size:
                return kept
            if self.max_sampling_rounds and tally.rounds >= self.max_sampling_rounds:
                raise RuntimeError(
                    f"dynamic sampling kept {len(kept)} of {self.batch_size} groups after {tally.rounds} extra "
                    f"round(s) ({tally.dropped} groups dropped by the experience operators "
                    f"{self.experience_ops.names()}, e.g. all-equal rewards): the tasks are too easy or too "
                    "hard for the model, or the filters too strict. Raise "
                    "algorithm.dynamic_sampling.max_rounds (0 = unlimited) or turn it off."
                )
            tally.rounds += 1

    def _groups_of(self, results: list[TaskResult], step: int, tally: StepTally) -> list[list[Experience]]:
        """One group per task that produced experiences (a fresh group id each), reported to an adaptive
        task set (``observe``) first."""
        observe = getattr(self.taskset, "observe", None)  # a TaskFeed; a bare TaskSetReader does not adapt
        groups = []
        for r in results:
            if not r.experiences:
                continue
            if observe is not None:
                observe(r.task, r.experiences)
            group = [
                e.replace(
                    group_id=self.next_group_id, model_version=sampled_by(e, tally.version), explore_step=step
                )
                for e in r.experiences
            ]
            self.next_group_id += 1
            tally.sampled += group
            tally.groups += 1
            tally.informative += len({e.reward for e in group}) > 1
            groups.append(group)
        return groups

    def _pass_operators(self, groups: list[list[Experience]], tally: StepTally) -> list[list[Experience]]:
        if self.experience_ops is None:
            return groups
        passed, metrics = self.experience_ops(groups)
        tally.dropped += len(groups) - len(passed)
        for k, v in metrics.items():
            tally.op_metrics[k] = tally.op_metrics.get(k, 0.0) + v
        return passed

    def _step_metrics(
        self, tally: StepTally, queued: int, seconds: float, engine_seconds: float, queue_wait: float
    ) -> dict[str, float]:
        metrics = summarize(tally.sampled, "rollout")
        metrics.update(
            {
                "rollout/tasks": float(tally.tasks),
                "rollout/experiences": float(queued),
                "rollout/failed_tasks": float(tally.failed),
                "rollout/failed_runs": float(tally.failed_runs),
                "rollout/retries": float(tally.retries),
                "rollout/skipped_long_tasks": float(tally.skipped_long),
                "rollout/truncated_prompts": float(tally.truncated),
                "rollout/seconds": seconds,
                "rollout/tokens_per_s": metrics.get("rollout/response_tokens", 0.0) / max(seconds, 1e-9),
                "rollout/queue_wait_seconds": queue_wait,
                # the profile (docs/performance.md): time in the engine, and outside it (reward functions,
                # environments, workflow code, waits for a batch to fill)
                "time/rollout": seconds,
                "time/rollout_generate": engine_seconds,
                "time/rollout_reward": max(0.0, seconds - engine_seconds),
                "rollout/model_version": float(tally.version),
                "rollout/groups": float(tally.groups),
                "rollout/informative_groups": float(tally.informative),
                **({"rollout/extra_rounds": float(tally.rounds)} if self.dynamic_sampling else {}),
                **tally.op_metrics,
                **self.model.metrics(),
            }
        )
        metrics.update(duration_metrics(tally.task_seconds))
        if (
            "rollout/in_flight_weight_loads" in metrics
        ):  # partial rollouts: samples whose tokens span versions
            spans = [len(set(e.action_versions())) > 1 for e in tally.sampled]
            metrics["rollout/mixed_version_samples"] = float(sum(spans))
        metrics["rollout/timed_out_tasks"] = float(tally.timed_out)
        if self.over_rollout_ratio > 1:
            metrics["rollout/cancelled_tasks"] = float(tally.cancelled)
            metrics["rollout/unused_groups"] = float(tally.unused)
        metrics["rollout/task_timeout_s"] = self.timeouts.limit()[0]  # for the next step's tasks; 0: none
        if self.faults is not None:
            metrics.update(self.faults.take_counts())
        hung = len(hung_calls())
        if hung:
            metrics["rollout/hung_env_calls"] = float(hung)  # overran env calls still running (envs/calls.py)
        if self.experience_ops is not None:
            metrics["rollout/dropped_groups"] = float(tally.dropped)
        if self.dynamic_sampling:
            metrics["rollout/sampling_rounds"] = float(tally.rounds + 1)
        skipped = getattr(self.taskset, "skipped_rows", 0)
        if skipped:
            metrics["rollout/skipped_rows"] = float(skipped)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Accuracy, reward and length on every eval task set (no experience reaches the buffer).

        With k = ``eval_params.n`` > 1 samples per task it also reports, over tasks, ``mean@k`` (mean
        accuracy of all samples), ``best@k`` (some sample right, i.e. pass@k) and ``worst@k`` (all right).
        """
        metrics: dict[str, float] = {}
        self._phase = "eval"
        for reader in self.eval_tasksets:
            t0 = time.perf_counter()
            results = self.run_tasks(reader.all_tasks(), self.eval_params, use_repeat_times=False)
            experiences = [e for r in results for e in r.experiences]
            prefix = f"eval/{reader.name}"
            metrics.update(summarize(experiences, prefix))
            metrics.update(at_k(results, self.eval_params.n, prefix))
            metrics[f"{prefix}/failed_tasks"] = float(sum(r.error is not None for r in results))
            metrics[f"{prefix}/skipped_long_tasks"] = float(sum(r.skipped_long for r in results))
            metrics[f"{prefix}/truncated_prompts"] = float(sum(r.truncated_prompts for r in results))
            metrics[f"{prefix}/seconds"] = time.perf_counter() - t0
            if self.faults is not None and self.faults.rates.in_eval:
                metrics.update(self.faults.take_counts(f"{prefix}/faults"))
        return metrics

    def in_flight(self) -> list[tuple[str, float]]:
        """``(task id, seconds running)`` of every task whose workflow runs now, longest first."""
        now = time.monotonic()
        with self._in_flight_lock:
            running = list(self._in_flight.values())
        return sorted(((task_id, now - start) for task_id, start in running), key=lambda x: -x[1])

    def _record_failure(self, task: Task, run_index: int | None, attempt: int, reason: str) -> None:
        if self.failure_sink is not None:
            record = {
                "when": self._phase,
                "task_id": task.task_id,
                "workflow": task.workflow,
                "run_index": run_index,  # None: the whole task failed
                "attempt": attempt,
                "reason": reason,
            }
            injected = fault_sites.current_injected()
            if injected:
                record["injected"] = injected  # faults injected into this attempt (trivium.faults)
            self.failure_sink(record)

    def _fault_scope(self, task: Task, order: int, attempt: int):
        """The scope in which faults may be injected into this attempt (a no-op context when off)."""
        if self.faults is None or (self._phase == "eval" and not self.faults.rates.in_eval):
            return contextlib.nullcontext()
        return self.faults.scope(f"{self._phase}|{order}|{task.task_id}|{attempt}")

    def run_tasks(
        self,
        tasks: Sequence[Task],
        params: SamplingParams,
        use_repeat_times: bool,
        enough: int | None = None,
    ) -> list[TaskResult]:
        """Run every task's workflow concurrently; model calls are batched across them. With ``enough``
        (over-rollout), go ahead once that many tasks finished with experiences (and ``over_rollout_wait_s``
        passed): the others are cancelled at their next model or environment call and come back
        ``cancelled``, with nothing."""
        if not tasks:
            return []
        workers = min(len(tasks), self.max_concurrency or len(tasks))
        explore = self._phase != "eval"
        cancels = [threading.Event() for _ in tasks] if enough is not None else None

        def one(item: tuple[int, Task]) -> TaskResult:
            order, task = item
            n = task.repeat_times if use_repeat_times else params.n
            timeout, set_by = self.timeouts.limit(explore)
            cancelled = None if cancels is None else cancels[order]
            if cancelled is not None and cancelled.is_set():  # cancelled before it started
                return TaskResult(task, [], cancelled=True)
            with self.model.worker(), self._running(task):
                t0 = time.monotonic()
                deadline = t0 + timeout if timeout else None
                # tail control on (over-rollout, a dynamic limit): a task in an environment call does not hold
                # the others' model batch (their durations are their own, not the slowest task's)
                away = self.model.away if cancelled is not None or self.timeouts.ratio else None
                with task_deadline(deadline, set_by, cancelled, away):  # its environment calls end by it too
                    result = self._attempts(
                        task, order, dataclasses.replace(params, n=n), deadline, set_by, cancelled
                    )
            result.seconds = time.monotonic() - t0
            if explore and result.error is None and result.experiences and not result.failed_runs:
                self.timeouts.succeeded(result.seconds)
            return result

        # Announcing the workers up front makes each engine batch hold the same requests whatever the
        # thread timing, so a seeded run samples the same tokens every time. This thread drives the engine
        # meanwhile: torch runs fastest on the thread that also trains (see BatchingRolloutModel.drive).
        # The workflows run in kept helper threads (threads.map_in_helpers: no thread start a task).
        with self.model.expect_workers(len(tasks), concurrency=workers), self.model.driving():
            futures, join = map_in_helpers(one, list(enumerate(tasks)), workers=workers, name="workflow")
            try:
                if cancels is not None:
                    self._go_ahead_at(enough, futures, cancels)
                self.model.drive(lambda: all(f.done() for f in futures))
            finally:
                join()
            results = [f.result() for f in futures]
        failures = [r for r in results if r.error is not None]
        self.failed_tasks += len(failures)
        dropped = sum(r.skipped_long or r.cancelled for r in results)
        if failures and len(failures) == len(results) - dropped:
            raise RuntimeError(
                f"every task of the batch failed; first: task {failures[0].task.task_id}: {failures[0].error!r}"
            ) from failures[0].error
        return results

    def _go_ahead_at(self, enough: int, futures: list, cancels: list[threading.Event]) -> None:
        """Over-rollout: drive the engine until ``enough`` tasks finished with experiences (and the wait
        passed) or all are done; then cancel the rest (their queued model requests at once)."""
        t0 = time.monotonic()

        def finished(f) -> bool:
            return f.done() and f.exception() is None and bool(f.result().experiences)

        def ahead() -> bool:
            if all(f.done() for f in futures):
                return True
            waited = time.monotonic() - t0 >= self.over_rollout_wait_s
            return waited and sum(map(finished, futures)) >= enough

        self.model.drive(ahead)
        stragglers = [order for order, f in enumerate(futures) if not f.done()]
        for order in stragglers:
            cancels[order].set()
        if stragglers:
            self.model.cancel(stragglers)
            log.info(
                "over-rollout: %d task(s) finished, %d cancelled",
                len(futures) - len(stragglers),
                len(stragglers),
            )

    def _attempts(
        self,
        task: Task,
        order: int,
        params: SamplingParams,
        deadline: float | None,
        set_by: str,
        cancelled: threading.Event | None = None,
    ) -> TaskResult:
        """The task's workflow, re-run up to ``max_retries`` more times after a failure (not after its time
        limit, nor for a prompt too long for the model)."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        attempt = 0
        while True:  # a timed-out run or the last attempt returns its failure
            handle = ModelHandle(
                self.model,
                params,
                order,
                deadline,
                task.on_long_row,
                deadline_set_by=set_by,
                cancelled=cancelled,
            )
            with self._fault_scope(task, order, attempt):
                try:
                    fault_sites.at("workflow", task.workflow, limit_s=timeout)
                    workflow = get_workflow(task.workflow)(**dict(task.workflow_args))
                    experiences = workflow.run(task, handle)
                except TaskCancelled:  # the step went ahead without it: dropped, not failed
                    return TaskResult(task, [], cancelled=True, retries=attempt)
                except PromptTooLong as exc:  # the row, not the run: no retry
                    if task.on_long_row == "error":
                        raise LongRowError(task, exc) from exc
                    log.warning("task %s skipped (on_long_row: skip): %s", task.task_id, exc)
                    self._record_failure(task, None, attempt, f"skipped: {exc}")
                    return TaskResult(task, [], skipped_long=True, retries=attempt)
                except Exception as exc:  # one task fails, the step goes on
                    log.warning(
                        "task %s failed in workflow '%s' (attempt %d of %d): %r",
                        task.task_id, task.workflow, attempt + 1, self.max_retries + 1, exc,
                    )  # fmt: skip
                    self._record_failure(task, None, attempt, repr(exc))
                    past = deadline is not None and time.monotonic() >= deadline
                    if isinstance(exc, WorkflowTimeoutError) or past or attempt == self.max_retries:
                        return TaskResult(task, [], exc, retries=attempt)
                    attempt += 1
                    continue
                runs = list(getattr(workflow, "failed_runs", ()))
                for run, reason in runs:
                    self._record_failure(task, run, attempt, reason)
            return TaskResult(
                task,
                experiences,
                failed_runs=len(runs),
                retries=attempt,
                truncated_prompts=handle.truncated_prompts,
            )

    @contextlib.contextmanager
    def _running(self, task: Task):
        key = threading.get_ident()
        with self._in_flight_lock:
            self._in_flight[key] = (task.task_id, time.monotonic())
        try:
            yield
        finally:
            with self._in_flight_lock:
                self._in_flight.pop(key, None)
