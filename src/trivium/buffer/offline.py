"""Offline training data: SFT demonstrations and preference pairs, read and checked like task sets.

Rows go through the same ``TaskSetReader`` as task sets, so a bad row gets the same error naming its
file, row and field. Text is tokenised with the model's chat template; only assistant tokens (and the EOS
that ends them) are trained on. A special token written in a row's text is tokenised as text, never as
the control token (``models/chat.py``).

Formats:
- SFT ``prompt_response``: ``prompt`` (user message) and ``response`` (assistant message) strings.
- SFT ``messages``: a chat ``messages`` list (system/user/assistant/tool turns, several assistant turns
  allowed); every assistant turn is trained on. An optional ``tools`` column (OpenAI tool schemas) is
  passed to the chat template, so demonstrations of tool use see the prompt the agent will see.
  With a vision-language model a message's ``content`` may be a list of parts, images among them:
  ``{"type": "image", "image": <path | data URL>}`` or OpenAI's ``{"type": "image_url", "image_url":
  {"url": <data URL>}}`` (multi-turn demonstrations of an agent that sees pictures).
- SFT ``prompt_response`` with an ``image`` column (a path, data URL or a list of them): the images, then
  the prompt, in the user message.
- preference: ``prompt``, ``chosen`` and ``rejected`` strings.
"""

from __future__ import annotations

import numpy as np
import torch

from trivium.buffer.task_reader import TaskSetReader
from trivium.config.schema import PreferenceDatasetConfig, SftDatasetConfig
from trivium.models.chat import encode_conversation, render_ids, text_ids
from trivium.types import Experience, PreferencePair, Task

SFT_FORMATS = {
    "prompt_response": {"prompt": (str,), "response": (str,)},
    "messages": {"messages": (list,)},
}
PREFERENCE_FIELDS = {"prompt": (str,), "chosen": (str,), "rejected": (str,)}


def _reader(cfg, required, name: str, seed: int, field: str) -> TaskSetReader:
    from trivium.buffer.sources import section_rows

    rows = section_rows(cfg, name, field)  # None: a local file the task reader reads itself
    return TaskSetReader(
        cfg.path if rows is None else rows,
        name=name,
        fields={**{k: k for k in required}, **cfg.fields},
        required=required,
        workflow="offline",
        reward_fn="none",
        repeat_times=1,
        on_bad_row=cfg.on_bad_row,
        shuffle=cfg.shuffle,
        seed=seed,
        max_rows=cfg.max_rows,
    )


# Token ids kept by an offline reader, at most (int32, ~64 MB; a row's mask adds a byte a token)
ENCODED_TOKENS_MAX = 16 * 1024 * 1024


class EncodedRows:
    """Rows' token ids kept after their first encoding, so a stage that reads its data more than once renders
    each row's chat template once (the quickstart's SFT: 4,000 rows over 800 steps of 64, 20 ms a batch of
    encoding saved on 12 of 13 reads). Kept as numpy arrays, up to ``max_tokens`` in all: past it, later rows
    are encoded each time they come, as without the cache. Dropped whole when the reader's tokenizer changes.
    Rows with images are not kept (each read puts its images in the run's store)."""

    def __init__(self, max_tokens: int = ENCODED_TOKENS_MAX):
        self.max_tokens = max_tokens
        self.tokens = 0
        self._rows: dict[int, tuple] = {}
        self._tokenizer = None

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, tokenizer, index: int):
        """The kept arrays of row ``index`` (None: not kept); forgets every row if ``tokenizer`` is new."""
        if tokenizer is not self._tokenizer:
            self._rows.clear()
            self.tokens, self._tokenizer = 0, tokenizer
        return self._rows.get(index)

    def keep(self, index: int, *arrays) -> None:
        """Keep row ``index``'s arrays (lists of ids or flags) while the token budget allows."""
        size = sum(len(a) for a in arrays)
        if index < 0 or self.tokens + size > self.max_tokens:
            return
        self._rows[index] = tuple(np.asarray(a, dtype=np.bool_ if _flags(a) else np.int32) for a in arrays)
        self.tokens += size


def _flags(values) -> bool:
    return len(values) > 0 and isinstance(values[0], bool)


class _OfflineReader:
    reader: TaskSetReader
    encoded: EncodedRows

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def skipped_rows(self) -> int:
        return self.reader.skipped_rows

    def state_dict(self) -> dict:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state)


class SftReader(_OfflineReader):
    """Demonstrations as experiences: the prompt, then the response; loss on the response only."""

    def __init__(
        self,
        cfg: SftDatasetConfig,
        tokenizer,
        seed: int = 0,
        field: str = "buffer.sft_dataset",
        vision=None,
        image_tokens: int | None = None,
    ):
        """``vision``: a ``VisionProcessor``, for rows with an ``image`` column (prompt_response format).
        ``image_tokens``: without one, count each image as that many tokens (sizing, ``trivium doctor``:
        the experiences then carry no images)."""
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.vision = vision
        self.image_tokens = image_tokens
        self.field = field
        self.reader = _reader(cfg, SFT_FORMATS[cfg.format], "sft", seed, field)
        self.encoded = EncodedRows()

    def next_batch(self, batch_size: int) -> list[Experience]:
        return [self.to_experience(t) for t in self.reader.next_batch(batch_size)]

    def to_experience(self, task: Task) -> Experience:
        kept = self.encoded.get(self.tokenizer, task.index)
        if kept is not None:
            tokens, mask = kept
            return _experience(tokens, len(tokens) - len(mask), mask, task.task_id)
        experience = self._encode(task)
        if not experience.images:
            self.encoded.keep(task.index, experience.tokens.tolist(), experience.action_mask.tolist())
        return experience

    def _encode(self, task: Task) -> Experience:
        if self.cfg.format == "messages":
            messages = list(task.data["messages"])
            if self.cfg.system_prompt and messages[0].get("role") != "system":
                messages.insert(0, {"role": "system", "content": self.cfg.system_prompt})
            tools = task.raw.get(self.cfg.fields.get("tools", "tools"))
            messages, refs, count = self._message_images(task, messages)
            tokens, mask, p = encode_conversation(self.tokenizer, messages, tools=tools or None)
            if refs:
                tokens, mask = _widened(self.vision, tokens, mask, refs)
            elif count:  # sizing without a processor: every image (its placeholder) as image_tokens tokens
                extra = count * (self.image_tokens - 1)
                tokens, mask = [self.tokenizer.pad_token_id] * extra + tokens, [False] * extra + mask
            p = mask.index(True)
            return _experience(tokens, p, mask[p:], task.task_id, refs)
        image = task.raw.get(self.cfg.fields.get("image", "image"))
        if image is None:
            prompt = _prompt_ids(self.tokenizer, task.data["prompt"], self.cfg.system_prompt)
            images: tuple[str, ...] = ()
        else:
            prompt, images = self._image_prompt(task, image)
        response = _response_ids(self.tokenizer, task.data["response"])
        return _experience(prompt + response, len(prompt), [True] * len(response), task.task_id, images)

    def _message_images(self, task: Task, messages: list) -> tuple[list, tuple[str, ...], int]:
        """``messages`` with each image part's image checked and stored (the part holding its reference),
        the references in order, and how many image parts there are."""
        where = f"{self.field} ({self.cfg.path}) row {task.index}"
        refs: list[str] = []
        count = 0
        out = []
        for m, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                out.append(message)
                continue
            parts = []
            for k, part in enumerate(content):
                image = _image_of(part, f"{where}, field 'messages'[{m}].content[{k}]")
                if image is not None:
                    count += 1
                    if self.vision is not None:
                        refs += self.vision.put([image], f"{where}, field 'messages'[{m}].content[{k}]")
                        part = {"type": "image", "image": refs[-1]}
                    elif not self.image_tokens:
                        raise ValueError(
                            f"{where}: message {m} holds an image and the model takes none: train a "
                            "vision-language model (model.path a folder with a vision_config, e.g. from "
                            "`trivium make-tiny --vlm`)"
                        )
                    else:
                        part = {"type": "image"}
                parts.append(part)
            out.append({**message, "content": parts})
        return out, tuple(refs), count

    def _image_prompt(self, task: Task, image) -> tuple[list[int], tuple[str, ...]]:
        """The prompt of a row with images: the images, then the prompt's text, in the user message."""
        where = f"{self.field} ({self.cfg.path}) row {task.index}, field 'image'"
        if self.vision is None and self.image_tokens:
            count = len(image) if isinstance(image, list) else 1
            prompt = _prompt_ids(self.tokenizer, task.data["prompt"], self.cfg.system_prompt)
            return prompt + [self.tokenizer.pad_token_id] * (count * self.image_tokens), ()
        if self.vision is None:
            raise ValueError(
                f"{where}: this row has an image and the model takes none: train a vision-language model "
                "(model.path a folder with a vision_config, e.g. from `trivium make-tiny --vlm`)"
            )
        refs = self.vision.put(image if isinstance(image, list) else [image], where)
        parts = [{"type": "image"} for _ in refs] + [{"type": "text", "text": task.data["prompt"]}]
        prompt = _prompt_ids(self.tokenizer, parts, self.cfg.system_prompt)
        return self.vision.expand(prompt, refs), refs


class PreferenceReader(_OfflineReader):
    """Preference rows as ``PreferencePair``s of token ids."""

    def __init__(
        self, cfg: PreferenceDatasetConfig, tokenizer, seed: int = 0, field: str = "buffer.preference_dataset"
    ):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.reader = _reader(cfg, PREFERENCE_FIELDS, "preference", seed, field)
        self.encoded = EncodedRows()

    def next_batch(self, batch_size: int) -> list[PreferencePair]:
        return [self.to_pair(t) for t in self.reader.next_batch(batch_size)]

    def to_pair(self, task: Task) -> PreferencePair:
        kept = self.encoded.get(self.tokenizer, task.index)
        if kept is None:
            kept = (
                _prompt_ids(self.tokenizer, task.data["prompt"], self.cfg.system_prompt),
                _response_ids(self.tokenizer, task.data["chosen"]),
                _response_ids(self.tokenizer, task.data["rejected"]),
            )
            self.encoded.keep(task.index, *kept)
        prompt, chosen, rejected = (torch.tensor(np.asarray(a), dtype=torch.long) for a in kept)
        return PreferencePair(prompt=prompt, chosen=chosen, rejected=rejected, pair_id=task.task_id)


def _prompt_ids(tokenizer, prompt: str | list, system_prompt: str | None) -> list[int]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt})
    return render_ids(tokenizer, messages, add_generation_prompt=True)


def _response_ids(tokenizer, response: str) -> list[int]:
    """The response as text (a special token written in it is not a control token), then eos."""
    return [*text_ids(tokenizer, response), tokenizer.eos_token_id]


def _image_of(part, where: str):
    """The image of an image content part (``image`` or OpenAI ``image_url``), None for other parts."""
    if not isinstance(part, dict) or part.get("type") not in ("image", "image_url"):
        return None
    if part["type"] == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise ValueError(
                f"{where}: an image_url part needs image_url.url (a data URL or path), got {part!r:.120}"
            )
        return url
    if not isinstance(part.get("image"), str):
        raise ValueError(f"{where}: an image part needs 'image' (a data URL or path), got {part!r:.120}")
    return part["image"]


def _widened(vision, tokens: list[int], mask: list[bool], refs) -> tuple[list[int], list[bool]]:
    """``tokens`` with each image placeholder widened to its image's visual tokens, ``mask`` along."""
    wide = vision.expand(tokens, refs)  # checks one placeholder per image
    widths = iter([vision.visual_tokens(vision.pixels(ref)[1]) for ref in refs])
    out_mask: list[bool] = []
    for token, value in zip(tokens, mask):
        out_mask += [value] * (next(widths) if token == vision.image_token_id else 1)
    return wide, out_mask


def _experience(
    tokens, prompt_length: int, action_mask, task_id: str, images: tuple[str, ...] = ()
) -> Experience:
    """``tokens`` and ``action_mask``: lists, or the int32 / bool arrays ``EncodedRows`` keeps."""
    n = len(tokens) - prompt_length
    return Experience(
        tokens=torch.tensor(np.asarray(tokens), dtype=torch.long),
        prompt_length=prompt_length,
        action_mask=torch.tensor(np.asarray(action_mask), dtype=torch.bool),
        logprobs=torch.zeros(n, dtype=torch.float32),
        task_id=task_id,
        images=images,
    )
