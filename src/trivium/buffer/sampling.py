"""Sample strategies: what the trainer's batch is made of, given the rollouts of a step.

A strategy is registered by name and chosen by ``algorithm.sample_strategy`` (the preset's by default).
It is built once per stage from the config (it may open its own data sources) and called every step
with that step's rollouts; it returns the experiences to train on.

- ``default``: the rollouts as they are.
- ``mix``: the rollouts plus ``expert_per_step`` demonstrations from ``buffer.expert_dataset`` (CHORD),
  marked ``is_expert`` and each in a group of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from trivium.config.schema import TriviumConfig
from trivium.registry import Registry
from trivium.types import Experience


def _is_strategy(obj) -> str | None:
    if isinstance(obj, type) and issubclass(obj, SampleStrategy):
        return None
    return f"is {obj!r}, not a subclass of trivium.buffer.sampling.SampleStrategy"


class SampleStrategy:
    """Base: keep the rollouts. Subclasses add data; ``problems`` lets validation reject a bad config."""

    def __init__(self, cfg: TriviumConfig, tokenizer, **args):
        if args:
            raise TypeError(f"sample strategy takes no arguments, got {sorted(args)}")

    @classmethod
    def problems(cls, cfg: TriviumConfig, args: dict) -> list[tuple[str, str, str]]:
        """``(field path, rule, fix)`` for each reason this strategy cannot run with ``cfg``."""
        return []

    def __call__(self, rollouts: Sequence[Experience], step: int) -> list[Experience]:
        return list(rollouts)


SAMPLE_STRATEGIES: Registry[type[SampleStrategy]] = Registry(
    "sample strategy",
    doc="a SampleStrategy subclass: Class(cfg, tokenizer, **args)(rollouts, step) -> experiences",
    check=_is_strategy,
)
SAMPLE_STRATEGIES.register("default")(SampleStrategy)


@SAMPLE_STRATEGIES.register("mix")
class MixExpertData(SampleStrategy):
    def __init__(self, cfg: TriviumConfig, tokenizer, expert_per_step: int | None = None):
        from trivium.buffer.offline import SftReader

        self.per_step = cfg.buffer.expert_per_step if expert_per_step is None else expert_per_step
        self.reader = SftReader(
            cfg.buffer.expert_dataset, tokenizer, seed=cfg.seed, field="buffer.expert_dataset"
        )

    @classmethod
    def problems(cls, cfg: TriviumConfig, args: dict) -> list[tuple[str, str, str]]:
        out = []
        if cfg.buffer.expert_dataset is None:
            out.append(
                (
                    "buffer.expert_dataset",
                    "sample strategy 'mix' adds expert demonstrations to RL batches",
                    "set buffer.expert_dataset.path",
                )
            )
        if not args.get("expert_per_step", cfg.buffer.expert_per_step):
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
