"""Task selectors: which tasks of a task set the explorer runs next (``buffer.selector``).

A selector is a ``TaskSelector`` subclass registered by name (or ``module:Class``), built once per task set
as ``Class(tasks, seed=seed, **buffer.selector_args)``. ``select(n)`` returns ``n`` indices into ``tasks``;
``observe(index, scores)`` gets the scores in [0, 1] of a task's rollouts (its accuracy, else its reward
clipped to [0, 1]) after every explore round; ``state_dict()`` is plain Python values, saved with every
checkpoint, and ``load_state_dict`` continues exactly (the next selections are those the first run would
have made).

- ``sequential``: file order, epoch after epoch.
- ``shuffle``: a fresh permutation per epoch, seeded by ``(seed, epoch)`` (the order the task reader uses).
- ``random``: independent uniform draws with replacement.
- ``curriculum``: easy to hard by a difficulty column (Bengio et al. 2009); the pool of the easiest tasks
  grows from ``start_fraction`` to all tasks over ``pace_tasks`` drawn tasks (``schedule`` linear, or
  ``root``: competence √(t (1 − c0²)/T + c0²) of Platanios et al. 2019), tasks drawn uniformly from it.
- ``online_difficulty`` (like BOTS, the Bayesian online task selection of Trinity-RFT): a Beta(α, β) posterior over each task's pass rate,
  α += Σ scores, β += Σ (1 − scores) per observation; each batch draws p_i ~ Beta(α_i, β_i) (Thompson
  sampling: unseen tasks are uncertain, so they are explored) and takes the ``n`` tasks whose p_i is
  nearest ``target`` (0.5: the tasks whose groups have the most reward variance). ``decay`` < 1 forgets old
  evidence (the model changes): before an update, α and β shrink towards the prior by that factor.
  ``pooled_prior``: the prior's mean is the pass rate over every observation so far (same strength
  α0 + β0), so an unseen task looks like an average one, not like a coin flip: with a weak model, tasks
  that were solved sometimes are revisited before unseen ones, which are mostly never solved.

Randomness is seeded by ``(seed, batch counter)`` alone, so a selector's state is its counters and
posteriors, and a resumed run selects exactly what an uninterrupted one would.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from trivium.registry import Registry, subclass_of
from trivium.types import Task

__all__ = ["SELECTORS", "TaskSelector"]


class TaskSelector:
    """Base: subclasses implement ``select``; ``observe`` and the state are optional."""

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0) -> None:
        if not tasks:
            raise ValueError(f"{type(self).__name__}: the task set has no tasks to select from")
        self.tasks, self.seed = list(tasks), seed
        self.batches = 0  # select() calls so far: seeds each batch's randomness

    def select(self, n: int) -> list[int]:
        raise NotImplementedError

    def observe(self, index: int, scores: Sequence[float]) -> None:
        """The scores in [0, 1] of task ``index``'s latest rollouts (ignored by selectors that do not adapt)."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": type(self).__name__,
            "num_tasks": len(self.tasks),
            "seed": self.seed,
            "batches": self.batches,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = self.state_dict()
        changed = [k for k in ("kind", "num_tasks", "seed") if state.get(k) != mine[k]]
        if changed:
            diff = ", ".join(f"{k}: saved {state.get(k)!r}, now {mine[k]!r}" for k in changed)
            raise ValueError(
                f"task selector: the saved state does not match this task set ({diff}), so the run would not "
                "resume at the same tasks. Restore the data, seed and buffer.selector it was saved with"
            )
        self.batches = int(state["batches"])

    def _rng(self) -> random.Random:
        """This batch's generator (a str seed goes through sha512: stable across runs and platforms)."""
        rng = random.Random(f"{self.seed}/{type(self).__name__}/{self.batches}")
        self.batches += 1
        return rng


SELECTORS: Registry[type[TaskSelector]] = Registry(
    "task selector",
    doc="a TaskSelector subclass: Class(tasks, seed=..., **args).select(n) -> indices",
    check=subclass_of(TaskSelector),
)


@SELECTORS.register("sequential")
class Sequential(TaskSelector):
    """Epochs in file order (``shuffle`` overrides ``_order``)."""

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0) -> None:
        super().__init__(tasks, seed=seed)
        self.epoch = self.position = 0

    def _order(self, epoch: int) -> list[int]:
        return list(range(len(self.tasks)))

    def select(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            order = self._order(self.epoch)
            take = min(n - len(out), len(order) - self.position)
            out += order[self.position : self.position + take]
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        self.batches += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


@SELECTORS.register("shuffle")
class Shuffle(Sequential):
    def __init__(self, tasks: Sequence[Task], *, seed: int = 0) -> None:
        super().__init__(tasks, seed=seed)
        self._cached: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._cached[0] != epoch:  # the same permutation as TaskSetReader's shuffled epochs
            order = list(range(len(self.tasks)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._cached = (epoch, order)
        return self._cached[1]


@SELECTORS.register("random")
class Uniform(TaskSelector):
    def select(self, n: int) -> list[int]:
        rng = self._rng()
        return [rng.randrange(len(self.tasks)) for _ in range(n)]


@SELECTORS.register("curriculum")
class Curriculum(TaskSelector):
    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        seed: int = 0,
        difficulty_field: str = "difficulty",
        higher_is_harder: bool = True,
        start_fraction: float = 0.25,
        pace_tasks: int = 1000,
        schedule: str = "linear",
    ) -> None:
        super().__init__(tasks, seed=seed)
        if not 0 < start_fraction <= 1 or pace_tasks < 1 or schedule not in ("linear", "root"):
            raise ValueError(
                f"curriculum selector: start_fraction={start_fraction} must be in (0, 1], pace_tasks={pace_tasks} "
                f">= 1 and schedule={schedule!r} 'linear' or 'root' (buffer.selector_args)"
            )
        self.start, self.pace, self.schedule = start_fraction, pace_tasks, schedule
        self.drawn = 0
        keys = [(_difficulty(t, difficulty_field), i) for i, t in enumerate(self.tasks)]
        self.order = [i for _, i in sorted(keys, key=lambda k: (k[0] if higher_is_harder else -k[0], k[1]))]

    def competence(self) -> float:
        """Fraction of the tasks (easiest first) in the pool after ``drawn`` tasks."""
        t = min(1.0, self.drawn / self.pace)
        c0 = self.start
        if self.schedule == "root":
            return min(1.0, math.sqrt(t * (1 - c0 * c0) + c0 * c0))
        return min(1.0, c0 + (1 - c0) * t)

    def select(self, n: int) -> list[int]:
        pool = self.order[: max(1, math.ceil(self.competence() * len(self.order)))]
        rng = self._rng()
        out = [pool[j] for j in rng.sample(range(len(pool)), min(n, len(pool)))]
        out += [rng.choice(pool) for _ in range(n - len(out))]  # a batch larger than the pool
        self.drawn += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "drawn": self.drawn}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.drawn = int(state["drawn"])


def _difficulty(task: Task, field: str) -> float:
    value = task.raw.get(field, task.data.get(field))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"curriculum selector: task {task.task_id} has {field}={value!r}, not a finite number. Give every "
            f"row a numeric '{field}' column, or set buffer.selector_args.difficulty_field"
        )
    return float(value)


@SELECTORS.register("online_difficulty")
class OnlineDifficulty(TaskSelector):
    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        seed: int = 0,
        target: float = 0.5,
        prior_alpha: float = 1.0,
        prior_beta: float = 1.0,
        decay: float = 1.0,
        pooled_prior: bool = False,
    ) -> None:
        super().__init__(tasks, seed=seed)
        if not 0 < target < 1 or prior_alpha <= 0 or prior_beta <= 0 or not 0 < decay <= 1:
            raise ValueError(
                f"online_difficulty selector: target={target} must be in (0, 1), prior_alpha={prior_alpha} and "
                f"prior_beta={prior_beta} > 0, decay={decay} in (0, 1] (buffer.selector_args)"
            )
        self.target, self.prior, self.decay = target, (prior_alpha, prior_beta), decay
        self.alpha = [prior_alpha] * len(self.tasks)
        self.beta = [prior_beta] * len(self.tasks)
        self.pooled_prior = pooled_prior
        self.pooled = [0.0, 0.0]  # every score observed so far: (sum, count)

    def expected_pass_rate(self, index: int) -> float:
        return self.alpha[index] / (self.alpha[index] + self.beta[index])

    def observe(self, index: int, scores: Sequence[float]) -> None:
        if not scores:
            return
        a0, b0 = self.prior
        s = sum(min(1.0, max(0.0, float(x))) for x in scores)
        self.alpha[index] = a0 + self.decay * (self.alpha[index] - a0) + s
        self.beta[index] = b0 + self.decay * (self.beta[index] - b0) + len(scores) - s
        self.pooled = [self.pooled[0] + s, self.pooled[1] + len(scores)]

    def _prior_shift(self) -> tuple[float, float]:
        """What to add to every (α, β) so that the prior's mean is the pooled pass rate (its strength kept)."""
        if not self.pooled_prior:
            return 0.0, 0.0
        a0, b0 = self.prior
        mean = (self.pooled[0] + a0) / (self.pooled[1] + a0 + b0)
        return (a0 + b0) * mean - a0, (a0 + b0) * (1 - mean) - b0

    def select(self, n: int) -> list[int]:
        rng = self._rng()
        out: list[int] = []
        while len(out) < n:  # a batch larger than the task set takes every task, then draws again
            da, db = self._prior_shift()
            draws = [rng.betavariate(a + da, b + db) for a, b in zip(self.alpha, self.beta, strict=True)]
            ranked = sorted(range(len(draws)), key=lambda i: (abs(draws[i] - self.target), i))
            out += ranked[: n - len(out)]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "alpha": list(self.alpha),
            "beta": list(self.beta),
            "pooled": list(self.pooled),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.alpha = [float(x) for x in state["alpha"]]
        self.beta = [float(x) for x in state["beta"]]
        self.pooled = [float(x) for x in state.get("pooled", (0.0, 0.0))]
