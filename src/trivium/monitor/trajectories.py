"""``trajectories.jsonl``: sampled experiences recorded token by token, for Studio's trajectory viewer.

Every ``monitor.trajectories.every`` train steps of an RL stage the trainer hands its batch to a
``TrajectoryRecorder`` before the update (the weights that sampled it, or the trainer's newest when
off-policy). For ``per_step`` experiences (two or more of a group, groups spread over the step), one line each holds the prompt and
response tokens (ids and text) and, per response token: the rollout engine's log-prob, the trainer's
log-prob and full-vocabulary entropy at the same weights (one extra forward pass over those rows, no
gradients), the advantage the loss uses, and the action mask (False: an environment or tool token inside a
multi-turn response). With the group, reward, weights version and step, that is what shows why a run learns
or collapses, one token at a time. Samples of a vision-language model also hold their images (references
into the run's ``images/`` store) and where each image's visual tokens are (``image_spans``), so the viewer
shows the picture in place of its tokens.

Recorded on the process that holds the whole model (``trainer.strategy`` single or ddp, local backend);
fsdp2 and Ray trainer ranks record nothing (a log line says so). A resumed stage drops its records after the
step it resumes from, so each recorded step appears once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trivium.files import rewrite_jsonl

log = logging.getLogger(__name__)

__all__ = ["TRAJECTORIES_FILE", "TrajectoryRecorder", "read_trajectories", "token_record"]

TRAJECTORIES_FILE = "trajectories.jsonl"


class TrajectoryRecorder:
    """``recorder(step, batch, experiences, advantages, logprobs_of)`` from ``Trainer.train_step``;
    ``logprobs_of(rows)``: the trainer's log-probs and entropies of those rows of the batch, [rows, L]."""

    def __init__(self, run_dir: Path, stage: str, every: int, per_step: int, tokenizer, resume_step: int = 0):
        self.path = Path(run_dir) / TRAJECTORIES_FILE
        self.stage, self.every, self.per_step, self.tokenizer = stage, every, per_step, tokenizer
        self.global_offset = 0  # the run's global step before this stage (set by the stage)
        if self.path.exists():
            _drop_after(self.path, stage, resume_step)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    @torch.no_grad()
    def __call__(
        self,
        step: int,
        batch,
        experiences: Sequence,
        advantages: torch.Tensor,
        logprobs_of: Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        if not self.due(step) or not experiences:
            return
        chosen = self._choose(experiences)
        rows = sorted({int(_row_of(batch, i)) for i in chosen})
        trainer_lp, entropy = logprobs_of(rows)
        image_token = batch.media.image_token_id if batch.media is not None else None
        lines = []
        for i in chosen:
            r = rows.index(int(_row_of(batch, i)))
            span = (batch.seq_index[rows[r]] == i).nonzero().flatten()
            line = self._line(
                step, experiences[i], span, r, rows[r], trainer_lp, entropy, advantages, image_token
            )
            lines.append(line)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())

    def _choose(self, experiences: Sequence) -> list[int]:
        """``per_step`` experiences, at least two of each group taken (answers to compare), from groups
        spread over the step (the first, the last, evenly between)."""
        by_group: dict[int, list[int]] = {}
        for i, e in enumerate(experiences):
            by_group.setdefault(e.group_id, []).append(i)
        groups = list(by_group.values())
        per_group = max(2, -(-self.per_step // len(groups)))
        count = min(len(groups), -(-self.per_step // per_group))
        picked = sorted({round(j * (len(groups) - 1) / max(1, count - 1)) for j in range(count)})
        return sorted(i for g in picked for i in groups[g][:per_group])[: self.per_step]

    def _line(
        self, step, e, span, sub_row, row, trainer_lp, entropy, advantages, image_token
    ) -> dict[str, Any]:
        resp = span[span.numel() - e.response_length :]  # a shared-prompt row's span holds no prompt but one
        mask = e.action_mask.bool()

        def values(t: torch.Tensor, row_index: int) -> list[float]:
            v = t[row_index, resp].float()
            return [round(x, 5) for x in torch.where(mask, v, torch.zeros_like(v)).tolist()]

        return {
            "stage": self.stage,
            "step": step,
            "global_step": self.global_offset + step,
            **token_record(e, self.tokenizer, image_token),
            "messages": e.info.get("messages"),  # the chat of a single-turn sample (annotation's prompt)
            "response": e.info.get("response"),
            "trainer_logprob": values(trainer_lp, sub_row),
            "entropy": values(entropy, sub_row),
            "advantage": values(advantages, row),
        }


def token_record(e, tokenizer, image_token_id: int | None = None) -> dict[str, Any]:
    """What a trajectory record holds of the experience itself: ids, reward and version, every prompt and
    response token (id and text), the action mask and the rollout engine's log-probs; with images, their
    references and ``image_spans``: ``[start, end)`` of each image's visual tokens (positions in prompt +
    response, image by image; ``image_token_id`` is the model's placeholder token)."""
    tokens, p = e.tokens.tolist(), e.prompt_length
    images = {}
    if e.images:
        images = {"images": list(e.images), "image_spans": image_spans(tokens, image_token_id, len(e.images))}
    return {
        "task_id": e.task_id,
        "group_id": e.group_id,
        "run_index": e.run_index,
        "turn": e.turn,
        "reward": float(e.reward),
        "model_version": e.model_version,
        "explore_step": e.explore_step,
        "prompt_ids": tokens[:p],
        "prompt_text": [tokenizer.decode([t]) for t in tokens[:p]],
        "response_ids": tokens[p:],
        "response_text": [tokenizer.decode([t]) for t in tokens[p:]],
        "mask": e.action_mask.bool().tolist(),
        "logprob": [round(x, 5) for x in e.logprobs.float().tolist()],
        **images,
    }


def image_spans(tokens: list[int], image_token_id: int | None, count: int) -> list[list[int]]:
    """``[start, end)`` of each run of ``image_token_id`` in ``tokens`` (one per image, in order); empty when
    the placeholder is unknown or the runs do not match ``count`` images (the viewer then shows tokens)."""
    if image_token_id is None:
        return []
    spans: list[list[int]] = []
    for i, t in enumerate(tokens):
        if t != image_token_id:
            continue
        if spans and spans[-1][1] == i:
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1])
    return spans if len(spans) == count else []


def _row_of(batch, i: int) -> int:
    """The batch row that holds sequence ``i``."""
    return int((batch.seq_index == i).any(dim=1).nonzero()[0, 0])


def _drop_after(path: Path, stage: str, step: int) -> None:
    """Keep other stages' lines and this stage's up to ``step`` (a resumed stage records its steps again)."""
    rewrite_jsonl(path, lambda record: record.get("stage") != stage or record.get("step", 0) <= step)


def read_trajectories(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete record of the run folder's ``trajectories.jsonl`` (none when there is no file)."""
    path = Path(run_dir) / TRAJECTORIES_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
