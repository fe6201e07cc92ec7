"""Sample strategies: what the trainer's batch is made of, given the rollouts of a step.

A strategy is registered by name and chosen by ``algorithm.sample_strategy`` (the preset's by default).
It is built once per stage, ``Class(context, **args)``, from a ``SampleContext`` (plain values of the stage:
the tokenizer, the seed, the batch's shape, the expert data) and ``algorithm.sample_strategy_args``; it may
open its own data sources, and it is called every step with that step's rollouts, returning the
experiences to train on. ``problems(context, args)`` lets ``check-config`` refuse a stage it cannot run.

- ``default``: the rollouts as they are.
- ``mix``: the rollouts plus ``expert_per_step`` demonstrations from ``buffer.expert_dataset`` (CHORD),
  marked ``is_expert`` and each in a group of its own.

Deprecated: a strategy written for the first form, ``Class(cfg, tokenizer, **args)`` with
``problems(cfg, args)`` (a first parameter named ``cfg``), is still built that way, with a warning; the
whole config will stop being passed in the next minor release.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trivium.registry import Registry
from trivium.types import Experience

__all__ = [
    "SAMPLE_STRATEGIES",
    "MixExpertData",
    "SampleContext",
    "SampleStrategy",
    "build_strategy",
    "problems_of",
]


@dataclass(frozen=True)
class SampleContext:
    """What a sample strategy is built from: the stage's values it may need, not the whole config."""

    tokenizer: Any  # the policy's tokenizer (None when only checking the config)
    seed: int  # the run's seed (a strategy's own sampling order)
    batch_size: int  # tasks per step (buffer.batch_size)
    repeat_times: int  # samples per task (buffer.taskset.repeat_times; 1 without a task set)
    expert_dataset: Any = None  # buffer.expert_dataset: a DatasetConfig of demonstrations, or None
    expert_per_step: int = 0  # buffer.expert_per_step

    @classmethod
    def from_config(cls, cfg, tokenizer=None) -> SampleContext:
        b = cfg.buffer
        return cls(
            tokenizer=tokenizer,
            seed=cfg.seed,
            batch_size=b.batch_size,
            repeat_times=b.taskset.repeat_times if b.taskset is not None else 1,
            expert_dataset=b.expert_dataset,
            expert_per_step=b.expert_per_step,
        )


def _is_strategy(obj) -> str | None:
    if isinstance(obj, type) and issubclass(obj, SampleStrategy):
        return None
    return f"is {obj!r}, not a subclass of trivium.buffer.sampling.SampleStrategy"


class SampleStrategy:
    """Base: keep the rollouts. Subclasses add data; ``problems`` lets validation reject a bad config."""

    def __init__(self, context: SampleContext, **args):
        if args:
            raise TypeError(f"sample strategy takes no arguments, got {sorted(args)}")

    @classmethod
    def problems(cls, context: SampleContext, args: dict) -> list[tuple[str, str, str]]:
        """``(field path, rule, fix)`` for each reason this strategy cannot run in this stage."""
        return []

    def __call__(self, rollouts: Sequence[Experience], step: int) -> list[Experience]:
        return list(rollouts)


SAMPLE_STRATEGIES: Registry[type[SampleStrategy]] = Registry(
    "sample strategy",
    doc="a SampleStrategy subclass: Class(context: SampleContext, **args)(rollouts, step) -> experiences",
    check=_is_strategy,
)
SAMPLE_STRATEGIES.register("default")(SampleStrategy)


def _takes_config(fn) -> bool:
    """Whether ``fn`` (an ``__init__`` or a bound ``problems``) is of the deprecated form taking ``cfg``."""
    params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
    return bool(params) and params[0] == "cfg"


def _deprecated(cls: type) -> None:
    warnings.warn(
        f"sample strategy {cls.__qualname__} takes (cfg, tokenizer, **args): that form is deprecated; take "
        "(context: trivium.buffer.sampling.SampleContext, **args) and problems(context, args)",
        DeprecationWarning,
        stacklevel=3,
    )


def build_strategy(cls: type[SampleStrategy], cfg, tokenizer, args: dict) -> SampleStrategy:
    """The stage's strategy ``cls`` with ``args`` (``launch/build.py`` builds it once per stage)."""
    if _takes_config(cls.__init__):
        _deprecated(cls)
        return cls(cfg, tokenizer, **args)
    return cls(SampleContext.from_config(cfg, tokenizer), **args)


def problems_of(cls: type[SampleStrategy], cfg, args: dict) -> list[tuple[str, str, str]]:
    """``cls.problems`` for this stage (``check-config``)."""
    if _takes_config(cls.problems):
        _deprecated(cls)
        return cls.problems(cfg, args)
    return cls.problems(SampleContext.from_config(cfg), args)


@SAMPLE_STRATEGIES.register("mix")
class MixExpertData(SampleStrategy):
    def __init__(self, context: SampleContext, expert_per_step: int | None = None):
        from trivium.buffer.offline import SftReader

        self.per_step = context.expert_per_step if expert_per_step is None else expert_per_step
        self.reader = SftReader(
            context.expert_dataset, context.tokenizer, seed=context.seed, field="buffer.expert_dataset"
        )

    @classmethod
    def problems(cls, context: SampleContext, args: dict) -> list[tuple[str, str, str]]:
        out = []
        if context.expert_dataset is None:
            out.append(
                (
                    "buffer.expert_dataset",
                    "sample strategy 'mix' adds expert demonstrations to RL batches",
                    "set buffer.expert_dataset.path",
                )
            )
        if not args.get("expert_per_step", context.expert_per_step):
            out.append(
                (
                    "buffer.expert_per_step",
                    "sample strategy 'mix' needs at least one demonstration a step",
                    "set buffer.expert_per_step (e.g. 20% of batch_size x repeat_times)",
                )
            )
        return out

    def __call__(self, rollouts: Sequence[Experience], step: int) -> list[Experience]:
        first = 1 + max((e.group_id for e in rollouts), default=-1)  # group ids unique within the batch
        demos = self.reader.next_batch(self.per_step)
        version = rollouts[0].model_version if rollouts else 0
        return [
            *rollouts,
            *(
                e.replace(is_expert=True, group_id=first + i, model_version=version, explore_step=step)
                for i, e in enumerate(demos)
            ),
        ]
