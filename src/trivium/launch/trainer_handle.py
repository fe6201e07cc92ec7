"""What the train loop asks of a trainer (``TrainerHandle``), and the one way a stage on several ranks
answers it (``FanOutTrainer``), and what makes two stages' ranks alike (``ranks_spec``: both backends keep a
stage's rank processes or actors for a next stage like it).

The loops of ``launch/`` talk to a ``TrainerHandle``: a ``trainer.Trainer`` in this process, rank 0's
``ranks.LeaderTrainer`` over rank processes on this machine, or the driver's ``ray_trainer.RayTrainer`` over
rank actors. A multi-rank handle makes every collective call (``COLLECTIVE``) on every rank, which
``FanOutTrainer`` writes once; each subclass says only how a call reaches its ranks (``_everywhere``: a
command channel, Ray calls) and how a dead rank is named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch

__all__ = ["COLLECTIVE", "FanOutTrainer", "TrainerHandle", "rank_state", "ranks_spec", "trains"]

# the calls every rank makes on its part of the model, in the same order on every rank
COLLECTIVE = ("train_step", "export_weights", "save_model", "load_state_dict")


class TrainerHandle(Protocol):
    algorithm: Any  # trainer.spec.AlgorithmSpec
    step: int  # train steps done in this stage

    def train_step(self, batch) -> dict[str, float]: ...

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]: ...

    def save_model(self, folder: Path) -> None: ...

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...


def trains(cfg) -> bool:
    """Whether a stage trains (and so, on several ranks, starts or takes trainer ranks)."""
    return cfg.mode in ("both", "train")


def ranks_spec(cfg, **backend: Any) -> str:
    """What a stage's trainer ranks are, as a comparable string: two stages with the same spec can train on
    the same rank processes (``ranks.RankGroup``) or actors (``ray_trainer``), which then drop one stage's
    trainer and build the next one's in the same process and process group. ``backend``: what else fixes a
    rank when it starts on that backend (its threads and device, its Ray resources)."""
    fields = {
        "world_size": cfg.trainer.world_size,
        "strategy": cfg.trainer.strategy,
        "plugins": cfg.plugins,  # loaded once, when a rank starts
        "wait_timeout_s": cfg.synchronizer.wait_timeout_s,  # the process group's, set when it forms
        **backend,
    }
    return json.dumps(fields, sort_keys=True, default=str)


def rank_state(state: dict[str, Any]) -> dict[str, Any]:
    """What every rank loads of a checkpoint's trainer state: all but the driver's resume point and RNGs."""
    return {k: v for k, v in state.items() if k not in ("resume", "rng")}


class FanOutTrainer:
    """A ``TrainerHandle`` whose collective calls go to every rank at once (``_everywhere``), rank 0's
    answer returned."""

    def _everywhere(self, command: str, *args: Any) -> Any:
        raise NotImplementedError

    def train_step(self, batch) -> dict[str, float]:
        return self._everywhere("train_step", list(batch))

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        return self._everywhere("export_weights", dtype)

    def save_model(self, folder: Path) -> None:
        self._everywhere("save_model", Path(folder))

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        self._everywhere("load_state_dict", rank_state(state), folder)
