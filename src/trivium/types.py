"""The few types that cross component boundaries: Task, Experience, TrainBatch.

Design decisions:
- An ``Experience`` holds the *token ids the rollout engine produced*, never text to be re-tokenised, so
  the trainer trains on exactly the sampled sequence.
- Every per-token tensor of a ``TrainBatch`` is aligned with ``input_ids`` on the *target* position: entry
  ``[r, t]`` is about token ``input_ids[r, t]`` predicted from ``input_ids[r, :t]``. Position 0 of every
  sequence is never a target. The same layout serves padded rows (one sequence a row) and packed rows
  (several sequences a row, told apart by ``seq_index``), so losses never care which one they get.
- Grouping ids (task, group, run, step) are separate fields, not one packed string.
- A third layout shares a prompt (``collate(..., shared_rows=...)``): one row holds the prompt once (less its
  last token), then per sample a copy of the prompt's last token and the sample's response, at the positions
  the response has in a row of its own; ``segment_ids`` says which tokens a token may attend to (the shared
  prompt and its own segment), so every response token gets the log-prob it gets alone, for the prompt's
  forward and backward once per group instead of once per sample (docs/performance.md).

A preference pair (DPO) is its own type, not an Experience with optional fields; ``collate_pairs``
lays it out as two sequences with explicit indices, so chosen and rejected are never paired by row order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Experience",
    "PreferencePair",
    "RowMedia",
    "Task",
    "TrainBatch",
    "collate",
    "collate_pairs",
    "shared_prompt_mask",
    "shared_prompt_rows",
    "shared_row_length",
    "version_runs",
]


@dataclass(frozen=True)
class Task:
    """One unit of work for the explorer: a row of a task set and how to run it.

    ``data`` holds the row's fields under the names the workflow asks for (after the task set's field
    mapping), e.g. ``{"question": "...", "answer": "7"}``; ``raw`` is the untouched source row.
    """

    task_id: str  # stable and unique within a run, e.g. "train.jsonl:17"
    data: Mapping[str, Any]
    workflow: str  # registered workflow name
    reward_fn: str  # registered reward name
    repeat_times: int = 1  # samples per task (the GRPO group size)
    workflow_args: Mapping[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    taskset: str = ""  # name of the task set it came from
    index: int = -1  # row index in that task set
    raw: Mapping[str, Any] = field(default_factory=dict)
    reward_args: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments of the reward
    reward_timeout_s: float = 0.0  # a reward call over this scores 0 (rewards/guard.py); 0 = no limit
    on_long_row: str = "skip"  # a prompt that fills the model's context: skip, truncate or error


@dataclass(frozen=True)
class Experience:
    """One sampled sequence and what the trainer needs to learn from it.

    Shapes: ``T = len(tokens)``, ``P = prompt_length``, response length ``T - P``.
    ``action_mask`` and ``logprobs`` cover the response only; ``action_mask`` is True on tokens the policy
    generated (False on environment or tool tokens inside a multi-turn response).
    """

    tokens: torch.Tensor  # [T] int64: prompt then response
    prompt_length: int  # P >= 1
    action_mask: torch.Tensor  # [T - P] bool
    logprobs: torch.Tensor  # [T - P] float32: rollout-engine log-probs (0 where action_mask is False)
    reward: float = 0.0
    task_id: str = ""
    group_id: int = -1  # experiences compared with each other (the samples of one task in one step)
    run_index: int = 0  # which of the task's repeat_times samples this is (one episode of a multi-turn task)
    turn: int = 0  # which model turn of its episode this is (step-wise multi-turn); 0 for single-turn
    model_version: int = 0  # weights version of the rollout model that produced it
    explore_step: int = -1
    is_expert: bool = False  # an expert demonstration mixed into an RL batch (CHORD), not a rollout
    info: Mapping[str, Any] = field(default_factory=dict)  # free-form, e.g. the response text
    metrics: Mapping[str, float] = field(default_factory=dict)  # numeric, averaged into rollout metrics
    # vision-language prompts: the prompt's images, ImageStore references in placeholder order
    images: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        t, p = int(self.tokens.numel()), int(self.prompt_length)
        if not isinstance(self.images, tuple):  # a storage gives lists back
            object.__setattr__(self, "images", tuple(self.images))
        if self.tokens.dim() != 1:
            raise ValueError(f"Experience.tokens must be 1-D [T], got shape {tuple(self.tokens.shape)}")
        if not 1 <= p <= t:
            raise ValueError(f"Experience.prompt_length={p} must be in [1, len(tokens)={t}]")
        for name in ("action_mask", "logprobs"):
            value = getattr(self, name)
            if tuple(value.shape) != (t - p,):
                raise ValueError(
                    f"Experience.{name} must have shape [len(tokens) - prompt_length] = [{t - p}], "
                    f"got {tuple(value.shape)} (task {self.task_id!r})"
                )

    @property
    def response_length(self) -> int:
        return int(self.tokens.numel()) - self.prompt_length

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def replace(self, **changes: Any) -> Experience:
        return dataclasses.replace(self, **changes)

    def action_versions(self) -> list[int]:
        """The weights version that sampled each action token, in order: from ``info["token_versions"]``
        (``version_runs`` over the response; -1 where not told) or else ``model_version`` for all."""
        runs = self.info.get("token_versions")
        if not runs:
            return [self.model_version] * self.num_action_tokens
        per_token = [int(v) for v, count in runs for _ in range(int(count))]
        mask = self.action_mask.tolist()
        if len(per_token) != len(mask):  # written by other code: trust the experience's own version
            return [self.model_version] * self.num_action_tokens
        return [v if v >= 0 else self.model_version for v, m in zip(per_token, mask) if m]


@dataclass(frozen=True)
class PreferencePair:
    """A prompt with a preferred and a dispreferred response (token ids; responses end with EOS)."""

    prompt: torch.Tensor  # [P] int64
    chosen: torch.Tensor  # [C] int64
    rejected: torch.Tensor  # [J] int64
    pair_id: str = ""

    def __post_init__(self) -> None:
        for name in ("prompt", "chosen", "rejected"):
            t = getattr(self, name)
            if t.dim() != 1 or t.numel() == 0:
                raise ValueError(
                    f"PreferencePair.{name} must be a non-empty 1-D tensor (pair {self.pair_id!r})"
                )

    def as_experiences(self) -> tuple[Experience, Experience]:
        def seq(response: torch.Tensor) -> Experience:
            n = response.numel()
            return Experience(
                tokens=torch.cat([self.prompt, response]),
                prompt_length=self.prompt.numel(),
                action_mask=torch.ones(n, dtype=torch.bool),
                logprobs=torch.zeros(n),
                task_id=self.pair_id,
            )

        return seq(self.chosen), seq(self.rejected)


@dataclass
class RowMedia:
    """The images of a batch's rows as a vision-language model consumes them (``VisionProcessor.row_media``):
    every row's images in row order, each row's in placeholder order."""

    pixel_values: torch.Tensor  # [patches, patch_dim]: all images' patches, image after image
    image_grid_thw: torch.Tensor  # [images, 3]: (t, h, w) patches of each image
    row_images: torch.Tensor  # [R] int64: how many images each row holds
    image_token_id: int  # the placeholder token the images' visual tokens replace

    def rows(self, rows: torch.Tensor | Sequence[int]) -> RowMedia:
        """The images of ``rows`` (in that order)."""
        rows = torch.as_tensor(rows, dtype=torch.long).tolist()
        counts = self.row_images.tolist()
        first_image = [sum(counts[:r]) for r in range(len(counts))]
        patches = self.image_grid_thw.prod(dim=1).tolist()
        first_patch = [sum(patches[:i]) for i in range(len(patches))]
        images = [first_image[r] + k for r in rows for k in range(counts[r])]
        patch_index = [p for i in images for p in range(first_patch[i], first_patch[i] + patches[i])]
        device = self.pixel_values.device
        return RowMedia(
            pixel_values=self.pixel_values[torch.tensor(patch_index, dtype=torch.long, device=device)],
            image_grid_thw=self.image_grid_thw[torch.tensor(images, dtype=torch.long, device=device)],
            row_images=self.row_images[torch.tensor(rows, dtype=torch.long, device=self.row_images.device)],
            image_token_id=self.image_token_id,
        )

    def to(self, device: torch.device | str) -> RowMedia:
        return dataclasses.replace(
            self,
            pixel_values=self.pixel_values.to(device),
            image_grid_thw=self.image_grid_thw.to(device),
            row_images=self.row_images.to(device),
        )

    def model_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The forward pass's image arguments for rows ``input_ids`` (none when the rows hold no image);
        positions are then left to the model (M-RoPE from ``mm_token_type_ids`` and the attention mask)."""
        if not int(self.row_images.sum()):
            return {}
        return {
            "pixel_values": self.pixel_values,
            "image_grid_thw": self.image_grid_thw,
            "mm_token_type_ids": (input_ids == self.image_token_id).int(),
            "position_ids": None,
        }


@dataclass
class TrainBatch:
    """Collated experiences. ``R`` rows of length ``L``; ``N`` sequences (``N == R`` unless packed).

    Per-token tensors are target-aligned with ``input_ids`` (see the module docstring).
    """

    input_ids: torch.Tensor  # [R, L] int64, pad_token_id on padding
    attention_mask: torch.Tensor | None  # [R, L] int64, 1 on real tokens; None when packed
    position_ids: torch.Tensor  # [R, L] int64, restarts at 0 for every sequence
    loss_mask: torch.Tensor  # [R, L] bool: True where the target token is an action token
    seq_index: torch.Tensor  # [R, L] int64: which sequence (0..N-1) a token belongs to; -1 on padding
    rollout_logprobs: torch.Tensor  # [R, L] float32: engine log-probs on action tokens, 0 elsewhere
    rewards: torch.Tensor  # [N] float32
    group_ids: torch.Tensor  # [N] int64
    model_versions: torch.Tensor  # [N] int64
    response_lengths: torch.Tensor  # [N] int64: number of action tokens n_i
    run_ids: torch.Tensor | None = None  # [N] int64: Experience.run_index (episode within its group)
    turns: torch.Tensor | None = None  # [N] int64: Experience.turn (model turn within its episode)
    states: torch.Tensor | None = None  # [N] int64: the environment state a turn started from (step-wise
    #                                    info["state"], equal ids for equal states), -1 where unknown
    is_expert: torch.Tensor | None = None  # [N] bool: expert demonstrations (CHORD); None when there are none
    packed: bool = False
    media: RowMedia | None = None  # the rows' images (vision-language experiences); None without images
    segment_ids: torch.Tensor | None = None  # [R, L] int64, shared-prompt rows only: 0 on a row's shared
    #                  prompt, k >= 1 on its k-th sample's segment, -1 on padding; None in the other layouts

    @property
    def num_seqs(self) -> int:
        return int(self.rewards.numel())

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            f.name: (v.to(device) if isinstance(v, (torch.Tensor, RowMedia)) else v)
            for f in dataclasses.fields(self)
            for v in [getattr(self, f.name)]
        }
        return TrainBatch(**moved)

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> TrainBatch:
        """The rows ``rows`` as a batch of their own; sequences are renumbered 0..N'-1.

        Rows hold whole sequences, so selecting rows never splits one.
        """
        device = self.input_ids.device
        rows = torch.as_tensor(rows, dtype=torch.long, device=device)
        seq_index = self.seq_index[rows]
        old = torch.unique(seq_index[seq_index >= 0])  # sorted old sequence ids present in these rows
        remap = torch.full((self.num_seqs,), -1, dtype=torch.long, device=device)
        remap[old] = torch.arange(old.numel(), device=device)
        new_index = torch.where(seq_index >= 0, remap[seq_index.clamp(min=0)], seq_index)
        return TrainBatch(
            input_ids=self.input_ids[rows],
            attention_mask=None if self.attention_mask is None else self.attention_mask[rows],
            position_ids=self.position_ids[rows],
            loss_mask=self.loss_mask[rows],
            seq_index=new_index,
            rollout_logprobs=self.rollout_logprobs[rows],
            rewards=self.rewards[old],
            group_ids=self.group_ids[old],
            model_versions=self.model_versions[old],
            response_lengths=self.response_lengths[old],
            run_ids=None if self.run_ids is None else self.run_ids[old],
            turns=None if self.turns is None else self.turns[old],
            states=None if self.states is None else self.states[old],
            is_expert=None if self.is_expert is None else self.is_expert[old],
            packed=self.packed,
            media=None if self.media is None else self.media.rows(rows),
            segment_ids=None if self.segment_ids is None else self.segment_ids[rows],
        )

    def forward_rows(
        self, rows: torch.Tensor | Sequence[int] | slice, width: int | None = None
    ) -> TrainBatch:
        """The fields a forward pass reads (ids, masks, positions, loss mask, images) of ``rows``, cut to the
        first ``width`` columns; sequence-level fields are left as they are (not needed for a forward)."""
        cols = slice(None, width)
        media = self.media
        if media is not None and not isinstance(rows, slice):
            media = media.rows(rows)
        return dataclasses.replace(
            self,
            input_ids=self.input_ids[rows, cols],
            attention_mask=None if self.attention_mask is None else self.attention_mask[rows, cols],
            position_ids=self.position_ids[rows, cols],
            loss_mask=self.loss_mask[rows, cols],
            media=media,
            segment_ids=None if self.segment_ids is None else self.segment_ids[rows, cols],
        )

    def model_inputs(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor | None]:
        """Keyword arguments of the model's forward pass for these rows (images included); ``dtype`` as in
        ``attention_inputs``."""
        inputs = {"input_ids": self.input_ids, **self.attention_inputs(dtype)}
        if self.media is not None:
            inputs.update(self.media.model_inputs(self.input_ids))
        return inputs

    def attention_inputs(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor | None]:
        """``attention_mask`` and ``position_ids`` of the forward pass.

        Right-padded rows (each row's real tokens a prefix, at positions 0, 1, ...: what ``collate`` builds)
        drop the padding mask and count positions on through the padding: under causal attention a real
        token sees only the tokens before it, which are all real, so its output is the same, and the
        padding's outputs are never read. Without a mask transformers runs ``sdpa`` with ``is_causal``,
        whose flash kernel skips the blocks above the diagonal that an explicit mask makes it compute
        (a bf16 forward and backward at 25M on CPU: 1.6x faster at 4k tokens, 1.1x at 1k). Packed rows
        (their mask is None already), other masks and image rows (M-RoPE reads the mask) are kept as is.
        Shared-prompt rows get a ``[R, 1, L, L]`` mask (``shared_prompt_mask``), additive in ``dtype`` (the
        dtype the attention computes in) where one is given: sdpa turns a boolean mask into that form in
        every layer and keeps each copy for the backward, while the layers share one additive tensor.
        """
        mask, positions = self.attention_mask, self.position_ids
        if self.segment_ids is not None:
            return {"attention_mask": shared_prompt_mask(self.segment_ids, dtype), "position_ids": positions}
        if mask is None or self.media is not None:
            return {"attention_mask": mask, "position_ids": positions}
        real = mask.bool()
        counted = torch.arange(mask.shape[1], device=mask.device).expand_as(positions)
        prefix = bool((real[:, 1:] <= real[:, :-1]).all()) and bool((positions == counted)[real].all())
        if not prefix:
            return {"attention_mask": mask, "position_ids": positions}
        return {"attention_mask": None, "position_ids": counted}

    def seq_to_tokens(self, values: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-sequence tensor ``[N]`` to ``[R, L]`` (0 on padding)."""
        out = values[self.seq_index.clamp(min=0)]
        return torch.where(self.seq_index >= 0, out, torch.zeros_like(out))


def shared_prompt_mask(segment_ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[R, 1, L, L]`` bool, True where query ``i`` may attend to key ``j`` of a shared-prompt row: ``j <= i``
    and key ``j`` in the shared prompt (segment 0) or in the query's own segment. Every token attends to
    itself (a padding query too: no all-masked row for the softmax), padding keys to no other query. With
    ``dtype``: additive instead, 0 where True and -inf elsewhere (what sdpa makes of a boolean mask). The
    forms sdpa and ``models/attention.py`` take (transformers passes a 4D mask through unchanged)."""
    length = segment_ids.shape[1]
    idx = torch.arange(length, device=segment_ids.device)
    causal = idx[None, :] <= idx[:, None]  # [L, L]
    key, query = segment_ids[:, None, :], segment_ids[:, :, None]  # [R, 1, L], [R, L, 1]
    visible = (key == 0) | ((key == query) & (key > 0))
    keep = (causal & visible) | torch.eye(length, dtype=torch.bool, device=segment_ids.device)
    if dtype is not None:
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))[
            :, None
        ]
    return keep[:, None]


def shared_prompt_rows(experiences: Sequence[Experience], max_row_tokens: int) -> list[list[int]]:
    """Rows of the shared-prompt layout: the experiences (indices) with the same prompt tokens, in order of
    first appearance, a row holding as many as fit in ``max_row_tokens`` (the prompt once, less its last
    token, then 1 + response tokens a sample) and at least two (a row's worth of sharing); 0 = no limit.
    Experiences with no prompt or no response tokens get rows of their own."""
    by_prompt: dict[bytes, list[int]] = {}
    alone: list[list[int]] = []
    for i, e in enumerate(experiences):
        if e.prompt_length < 1 or e.response_length < 1 or e.images:
            alone.append([i])
        else:
            by_prompt.setdefault(e.tokens[: e.prompt_length].numpy().tobytes(), []).append(i)
    rows: list[list[int]] = []
    for members in by_prompt.values():
        prefix = experiences[members[0]].prompt_length - 1
        row: list[int] = []
        length = prefix
        for i in members:
            segment = experiences[i].response_length + 1
            if len(row) >= 2 and max_row_tokens and length + segment > max_row_tokens:
                rows.append(row)
                row, length = [], prefix
            row.append(i)
            length += segment
        rows.append(row)
    return sorted(rows + alone)


def shared_row_length(experiences: Sequence[Experience], row: Sequence[int]) -> int:
    """Tokens of a shared-prompt row (``shared_prompt_rows``)."""
    return experiences[row[0]].prompt_length - 1 + sum(experiences[i].response_length + 1 for i in row)


def version_runs(versions: Sequence[int]) -> list[list[int]]:
    """``[[version, count], ...]``: a per-token version list in runs (``info["token_versions"]``; -1 marks a
    token no model sampled, or one whose version the engine did not say)."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return runs


def collate(
    experiences: Sequence[Experience],
    pad_token_id: int,
    pack_length: int | None = None,
    images: Callable[[Sequence[Sequence[str]]], RowMedia] | None = None,
    shared_rows: Sequence[Sequence[int]] | None = None,
) -> TrainBatch:
    """Build a ``TrainBatch`` from experiences.

    Padded (default): one sequence per row, right-padded to the longest. Packed (``pack_length`` set):
    sequences are placed first-fit-decreasing into rows of at most ``pack_length`` tokens (a sequence
    longer than that gets a row of its own); padding then only fills the row ends. Packed rows need a
    model whose attention honours ``position_ids`` restarts (transformers builds block-causal masks from
    them when ``attention_mask`` is None). Shared prompt (``shared_rows`` set, from ``shared_prompt_rows``):
    each row holds those experiences, which share their prompt tokens, in the layout of the module docstring.
    """
    if not experiences:
        raise ValueError("collate() needs at least one experience")
    with_images = next((e for e in experiences if e.images), None)
    if with_images is not None and images is None:
        raise ValueError(
            f"experience of task {with_images.task_id!r} carries images, and this trainer's model takes none: "
            "train a vision-language model (a folder with a vision_config) on image tasks"
        )
    if with_images is not None and pack_length is not None:
        raise ValueError(
            "trainer.pack_length: packed rows are not supported with images (a row's M-RoPE positions are "
            "computed per sequence from its attention mask); set trainer.pack_length: null for image tasks"
        )
    if shared_rows is not None:
        if with_images is not None or pack_length is not None:
            raise ValueError("collate(): shared_rows is a layout of its own: not with pack_length or images")
        return _collate_shared(experiences, pad_token_id, shared_rows)
    lengths = [int(e.tokens.numel()) for e in experiences]
    if pack_length is None:
        rows = [[i] for i in range(len(experiences))]
    else:
        rows = _first_fit_decreasing(lengths, pack_length)
    width = max(sum(lengths[i] for i in row) for row in rows)
    n_rows = len(rows)
    input_ids = torch.full((n_rows, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n_rows, width), dtype=torch.long)
    position_ids = torch.zeros((n_rows, width), dtype=torch.long)
    loss_mask = torch.zeros((n_rows, width), dtype=torch.bool)
    seq_index = torch.full((n_rows, width), -1, dtype=torch.long)
    rollout_lp = torch.zeros((n_rows, width), dtype=torch.float32)
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            e, n = experiences[i], lengths[i]
            end = start + n
            input_ids[r, start:end] = e.tokens
            attention[r, start:end] = 1
            position_ids[r, start:end] = torch.arange(n)
            seq_index[r, start:end] = i
            resp = slice(start + e.prompt_length, end)
            loss_mask[r, resp] = e.action_mask.bool()
            rollout_lp[r, resp] = torch.where(e.action_mask.bool(), e.logprobs.float(), 0.0)
            start = end
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=None if pack_length is not None else attention,
        position_ids=position_ids,
        loss_mask=loss_mask,
        seq_index=seq_index,
        rollout_logprobs=rollout_lp,
        packed=pack_length is not None,
        media=None if with_images is None else images([experiences[row[0]].images for row in rows]),
        **_sequence_fields(experiences),
    )


def _collate_shared(
    experiences: Sequence[Experience], pad_token_id: int, shared_rows: Sequence[Sequence[int]]
) -> TrainBatch:
    """``collate``'s shared-prompt layout: per row ``prompt[:-1]`` (segment 0, seq_index -1: no sequence's
    own), then per experience ``[prompt[-1], *response]`` (segment k, its seq_index) at positions
    ``P-1, P, ...``; a row of one experience is its sequence as the padded layout lays it out."""
    placed = sorted(i for row in shared_rows for i in row)
    if placed != list(range(len(experiences))):
        raise ValueError("collate(): shared_rows must place every experience exactly once")
    width = max(shared_row_length(experiences, row) for row in shared_rows)
    shape = (len(shared_rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    seq_index = torch.full(shape, -1, dtype=torch.long)
    segment_ids = torch.full(shape, -1, dtype=torch.long)
    rollout_lp = torch.zeros(shape, dtype=torch.float32)
    for r, row in enumerate(shared_rows):
        first = experiences[row[0]]
        prompt = first.prompt_length - 1
        if any(
            not torch.equal(experiences[i].tokens[: first.prompt_length], first.tokens[: first.prompt_length])
            for i in row
        ):
            raise ValueError(f"collate(): shared row {r} holds experiences whose prompts differ")
        input_ids[r, :prompt] = first.tokens[:prompt]
        position_ids[r, :prompt] = torch.arange(prompt)
        segment_ids[r, :prompt] = 0
        start = prompt
        for k, i in enumerate(row, start=1):
            e = experiences[i]
            end = start + e.response_length + 1
            input_ids[r, start:end] = e.tokens[prompt:]
            position_ids[r, start:end] = torch.arange(prompt, prompt + end - start)
            seq_index[r, start:end] = i
            segment_ids[r, start:end] = k
            action = e.action_mask.bool()
            loss_mask[r, start + 1 : end] = action
            rollout_lp[r, start + 1 : end] = torch.where(action, e.logprobs.float(), 0.0)
            start = end
        attention[r, :start] = 1
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        loss_mask=loss_mask,
        seq_index=seq_index,
        rollout_logprobs=rollout_lp,
        segment_ids=segment_ids,
        **_sequence_fields(experiences),
    )


def _sequence_fields(experiences: Sequence[Experience]) -> dict[str, Any]:
    """A ``TrainBatch``'s per-sequence fields, in the experiences' order."""
    return dict(
        rewards=torch.tensor([float(e.reward) for e in experiences], dtype=torch.float32),
        group_ids=torch.tensor([e.group_id for e in experiences], dtype=torch.long),
        model_versions=torch.tensor([e.model_version for e in experiences], dtype=torch.long),
        response_lengths=torch.tensor([e.num_action_tokens for e in experiences], dtype=torch.long),
        run_ids=torch.tensor([e.run_index for e in experiences], dtype=torch.long),
        turns=torch.tensor([e.turn for e in experiences], dtype=torch.long),
        states=_state_ids(experiences),
        is_expert=torch.tensor([e.is_expert for e in experiences])
        if any(e.is_expert for e in experiences)
        else None,
    )


def _state_ids(experiences: Sequence[Experience]) -> torch.Tensor | None:
    """Dense ids of the experiences' ``info["state"]`` keys (-1 where absent); None when none has one."""
    keys = [e.info.get("state") for e in experiences]
    if all(k is None for k in keys):
        return None
    ids: dict[str, int] = {}
    return torch.tensor(
        [-1 if k is None else ids.setdefault(str(k), len(ids)) for k in keys], dtype=torch.long
    )


def collate_pairs(
    pairs: Sequence[PreferencePair], pad_token_id: int, shared_rows: Sequence[Sequence[int]] | None = None
) -> tuple[TrainBatch, torch.Tensor, torch.Tensor]:
    """Collate pairs as ``2P`` sequences; returns the batch and ``chosen_index``, ``rejected_index`` [P].

    Sequence ``chosen_index[k]`` and ``rejected_index[k]`` are the two responses of pair k, in rows of their
    own or in ``shared_rows`` (``collate``'s; DPO's are ``[2k, 2k + 1]``, a pair a row).
    """
    sequences = [e for pair in pairs for e in pair.as_experiences()]
    batch = collate(sequences, pad_token_id, shared_rows=shared_rows)
    index = torch.arange(len(pairs)) * 2
    return batch, index, index + 1


def _first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    if capacity < 1:
        raise ValueError(f"pack_length must be >= 1, got {capacity}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for r, space in enumerate(free):
            if lengths[i] <= space:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    for row in rows:
        row.sort()
    return rows
