"""Experience operators: what every explore step's groups pass through before they reach the buffer.

An operator is a function ``op(groups, **args) -> groups`` over a list of groups (a group: the experiences
of one task in one step, ``list[Experience]``), registered in ``EXPERIENCE_OPS`` or named
``module:function``. ``buffer.experience_ops: [{name, args}]`` lists them; ``ExperiencePipeline`` runs them
in order and counts, per operator, the experiences it kept as they were, changed (returned as new objects,
e.g. ``e.replace(reward=...)``) and dropped, and the groups it dropped: ``ops/<name>/kept|changed|dropped|
dropped_groups``, and the mean reward of what it passes on (``ops/<name>/reward_mean``), in the step's
metrics. An operator may also return ``(groups, counts)``: its own counts, as ``ops/<name>/<count>``. An
operator that takes a ``max_tokens`` argument gets
``explorer.rollout.max_tokens`` unless its args set it.

Filters: ``zero_variance`` (groups whose rewards are all equal: DAPO's dynamic sampling, docs/algorithms.md
§6), ``reward_range``, ``response_length``, ``truncated``, ``invalid_format`` (a regex the response must
match), ``duplicate_responses`` (the same tokens twice within a group). Shapers: ``format_bonus``,
``length_penalty`` (linear beyond a target length), ``overlong_penalty`` (DAPO's soft ramp, §6),
``reward_scale`` (scale, shift and clip). Judge: ``ruler`` (rewards/ruler.py: a judge model scores a whole
group of answers against each other in one call, RULER-style).

With ``algorithm.dynamic_sampling.enabled`` the explorer samples more tasks until ``batch_size`` groups pass
the operators, and the pipeline starts with ``zero_variance`` when the list does not name it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trivium.algorithm.rewards_shaping import overlong_penalty as _overlong
from trivium.registry import Registry, callable_part
from trivium.types import Experience

__all__ = ["EXPERIENCE_OPS", "ExperiencePipeline"]

Groups = list[list[Experience]]

EXPERIENCE_OPS: Registry = Registry(
    "experience operator",
    doc="a function op(groups: list[list[Experience]], **args) -> list[list[Experience]]",
    check=callable_part,
    builtins=["trivium.buffer.judged_ops"],  # ruler: written with the other judges (rewards/ruler.py)
)


class ExperiencePipeline:
    """``steps``: ``(name, args)`` pairs. Calling it returns the surviving non-empty groups and the counts."""

    def __init__(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]], *, max_tokens: int | None = None
    ) -> None:
        self.steps = []
        labels: list[str] = []
        for i, (name, args) in enumerate(steps):
            fn = EXPERIENCE_OPS.get(name)
            args = dict(args)
            params = inspect.signature(fn).parameters
            if "max_tokens" in params and "max_tokens" not in args and max_tokens is not None:
                args["max_tokens"] = max_tokens
            try:  # unknown keys, and the operator's own value checks (ruler: the judge's URL)
                EXPERIENCE_OPS.check_args(name, args)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"buffer.experience_ops[{i}]: {exc}") from None
            label = name.rpartition(":")[2].rpartition(".")[2]
            label = label if label not in labels else f"{label}_{i}"
            labels.append(label)
            self.steps.append((label, fn, args))

    def names(self) -> list[str]:
        return [label for label, _, _ in self.steps]

    def __call__(self, groups: Groups) -> tuple[Groups, dict[str, float]]:
        metrics: dict[str, float] = {}
        for label, fn, args in self.steps:
            before = {id(e) for g in groups for e in g}
            n_groups = len(groups)
            out = fn([list(g) for g in groups], **args)
            if isinstance(out, tuple):  # (groups, the operator's own counts)
                out, extra = out
                metrics.update({f"ops/{label}/{k}": float(v) for k, v in extra.items()})
            groups = [list(g) for g in out if g]
            n_after = sum(len(g) for g in groups)
            kept = sum(id(e) in before for g in groups for e in g)
            metrics[f"ops/{label}/kept"] = float(kept)
            metrics[f"ops/{label}/changed"] = float(n_after - kept)
            metrics[f"ops/{label}/dropped"] = float(max(0, len(before) - n_after))
            metrics[f"ops/{label}/dropped_groups"] = float(max(0, n_groups - len(groups)))
            if n_after:
                metrics[f"ops/{label}/reward_mean"] = sum(e.reward for g in groups for e in g) / n_after
        return groups, metrics


def _each(groups: Groups, keep) -> Groups:
    return [[e for e in g if keep(e)] for g in groups]


def _response(e: Experience) -> str:
    return str(e.info.get("response", ""))


def _is_truncated(e: Experience, max_tokens: int | None) -> bool:
    finish = e.info.get("finish_reason")
    if finish is not None:
        return finish == "length"
    return max_tokens is not None and e.response_length >= max_tokens


@EXPERIENCE_OPS.register("zero_variance")
def zero_variance(groups: Groups, eps: float = 0.0) -> Groups:
    """Drop groups whose rewards span at most ``eps`` (all equal by default; a group of one too): their
    group-relative advantages are zero, they only dilute the batch."""
    return [g for g in groups if len(g) > 1 and max(e.reward for e in g) - min(e.reward for e in g) > eps]


@EXPERIENCE_OPS.register("reward_range")
def reward_range(groups: Groups, min: float | None = None, max: float | None = None) -> Groups:
    """Drop experiences whose reward is below ``min`` or above ``max`` (e.g. a judge's failure value)."""
    return _each(groups, lambda e: (min is None or e.reward >= min) and (max is None or e.reward <= max))


@EXPERIENCE_OPS.register("response_length")
def response_length(groups: Groups, min_tokens: int = 0, max_tokens_kept: int | None = None) -> Groups:
    """Drop experiences whose response has fewer than ``min_tokens`` or more than ``max_tokens_kept`` tokens."""
    return _each(
        groups,
        lambda e: (
            e.response_length >= min_tokens
            and (max_tokens_kept is None or e.response_length <= max_tokens_kept)
        ),
    )


@EXPERIENCE_OPS.register("truncated")
def truncated(groups: Groups, max_tokens: int | None = None, whole_group: bool = False) -> Groups:
    """Drop responses cut at the generation limit (finish reason 'length', or ``max_tokens`` tokens when the
    workflow recorded no finish reason): DAPO's overlong filtering. ``whole_group``: drop their groups."""
    if whole_group:
        return [g for g in groups if not any(_is_truncated(e, max_tokens) for e in g)]
    return _each(groups, lambda e: not _is_truncated(e, max_tokens))


@EXPERIENCE_OPS.register("invalid_format")
def invalid_format(groups: Groups, pattern: str, full: bool = False) -> Groups:
    """Drop responses that do not match the regex ``pattern`` (``re.search``; ``full``: ``re.fullmatch``)."""
    regex = re.compile(pattern, re.S)
    match = regex.fullmatch if full else regex.search
    return _each(groups, lambda e: match(_response(e)) is not None)


@EXPERIENCE_OPS.register("duplicate_responses")
def duplicate_responses(groups: Groups) -> Groups:
    """Within each group, keep the first of responses with the same tokens."""
    out = []
    for g in groups:
        seen: set[tuple[int, ...]] = set()
        kept = []
        for e in g:
            key = tuple(e.tokens[e.prompt_length :].tolist())
            if key not in seen:
                seen.add(key)
                kept.append(e)
        out.append(kept)
    return out


def _shape(groups: Groups, reward) -> Groups:
    """Set each reward to ``reward(e)``; an experience whose reward does not change stays the same object."""
    out = []
    for g in groups:
        new = []
        for e in g:
            r = float(reward(e))
            new.append(e if r == e.reward else e.replace(reward=r))
        out.append(new)
    return out


@EXPERIENCE_OPS.register("format_bonus")
def format_bonus(
    groups: Groups, pattern: str, bonus: float = 0.1, penalty: float = 0.0, full: bool = False
) -> Groups:
    """Add ``bonus`` to responses matching the regex ``pattern``, ``penalty`` (e.g. -0.1) to the others."""
    regex = re.compile(pattern, re.S)
    match = regex.fullmatch if full else regex.search
    return _shape(groups, lambda e: e.reward + (bonus if match(_response(e)) else penalty))


@EXPERIENCE_OPS.register("length_penalty")
def length_penalty(groups: Groups, coef: float = 0.001, target: int = 0) -> Groups:
    """Subtract ``coef`` per response token beyond ``target``: r − coef · max(0, |y| − target)."""
    return _shape(groups, lambda e: e.reward - coef * max(0, e.response_length - target))


@EXPERIENCE_OPS.register("overlong_penalty")
def overlong_penalty(groups: Groups, max_tokens: int, cache_length: int = 4, factor: float = 1.0) -> Groups:
    """DAPO's soft overlong penalty (docs/algorithms.md §6): 0 up to max_tokens − cache_length tokens, then a
    ramp to −factor at max_tokens (``algorithm.rewards_shaping.overlong_penalty``)."""
    out = []
    for g in groups:
        lengths = torch.tensor([e.response_length for e in g])
        penalty = _overlong(lengths, max_length=max_tokens, cache_length=cache_length, factor=factor).tolist()
        out.append([e if p == 0 else e.replace(reward=e.reward + p) for e, p in zip(g, penalty, strict=True)])
    return out


@EXPERIENCE_OPS.register("reward_scale")
def reward_scale(
    groups: Groups,
    scale: float = 1.0,
    shift: float = 0.0,
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> Groups:
    """r ← clip(scale · r + shift, clip_min, clip_max)."""

    def new(r: float) -> float:
        r = scale * r + shift
        r = r if clip_min is None else max(clip_min, r)
        return r if clip_max is None else min(clip_max, r)

    return _shape(groups, lambda e: new(e.reward))
