"""A rollout engine over a plain transformers causal LM: our own decode loop on its ``DynamicCache``.

Design decisions (measured on CPU by benchmarks/engines.py: 1.8× ``model.generate`` in fp32, 3.0× with bf16
weights, on a 25M model with ~100-token answers):
- Prefill each *distinct* prompt once, then copy its KV-cache rows to its samples
  (``DynamicCache.batch_select_indices`` with repeated indices). GRPO asks for n samples of one prompt, so
  prefill work drops n-fold.
- Drop finished rows from the batch and the cache every step, so late steps only pay for live rows.
- The KV cache of each layer lives in a buffer reserved for the whole call (``ReservedLayer``, a
  ``DynamicLayer`` that writes new keys/values into place): ``DynamicLayer`` appends by ``torch.cat``,
  a copy of the whole cache per token and layer (without it a 25M call went from 7.8 to 6.9 s).
- Left padding with explicit ``attention_mask`` and ``position_ids``: each row's positions start at 0 at its
  first real token, exactly as in the trainer's teacher-forced pass, so log-probs match it (see
  ``protocol.py`` for the contract; exact to ~1e-5 in fp32).
- Prefill runs the model's own forward (its attention, sdpa by default). The decode steps, one token a
  row, run through ``DecodeStep`` (``decode_step.py``) for Llama-family models: the model's own modules
  without transformers' per-call glue, and attention over the cache as two matrix products (measured on
  the 25M shape: decode_step.py's docstring and docs/performance.md). Other models decode through their
  forward.
- One lock serialises ``generate`` and ``update_weights``: weights never change under a running batch,
  unless ``in_flight_updates`` (``explorer.rollout.in_flight_updates``, partial rollouts): then an update
  that arrives while a batch decodes is handed to its decode loop, which loads it at the next token
  boundary, prefills every live row's prompt and response so far again under the new weights (so each
  token's log-prob is exactly the log-prob of the weights that sampled it, as a teacher-forced pass of
  those weights computes it), and goes on; ``Generation.versions`` says which weights sampled each token.
  The update returns once the new weights are in, without waiting for the batch to end.
- Lower precision is the caller's choice, two ways (measured on the 25M workload, benchmarks/engines.py):
  bf16 *weights* (``dtype``: the engine's copy of the policy is cast, memory halves) or bf16 *autocast*
  (``autocast_dtype``: fp32 weights, matmuls in bf16). Either way the reported log-probs are fp32
  ``log_softmax`` of the logits the engine sampled from, so they are exact for the policy that sampled;
  they differ from the trainer's fp32 recomputation by the bf16 error, which the trainer logs every step
  (``mismatch/logprob_abs_max``) and ``algorithm.rollout_is_cap`` can correct.

Left out on purpose: continuous batching across calls (the batching wrapper merges callers instead),
CUDA graphs and paged caches. For large models use a dedicated engine behind the same protocol.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from trivium.models.decode_step import DecodeStep
from trivium.models.loading import load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from trivium.models.protocol import (
    FinishReason,
    Generation,
    SamplingParams,
    check_prompts,
    checked_state_dict,
    eos_token_ids,
)
from trivium.models.sampling import sample_next
from trivium.models.stopping import StopChecker
from trivium.models.vision import PromptImages
from trivium.models.weights import same_tensors

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["ReservedLayer", "TransformersEngine"]

log = logging.getLogger(__name__)


class TransformersEngine:
    """``RolloutModel`` over ``model`` (moved to ``device``/``dtype``, put in eval mode).

    ``seed`` seeds the engine's own ``torch.Generator``: the same seed and the same sequence of calls give
    the same samples. None draws a random seed. ``autocast_dtype`` (bfloat16 / float16): run the forward
    passes under ``torch.autocast`` with that dtype, weights kept in ``dtype``.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device,
        dtype: str | torch.dtype,
        seed: int | None = None,
        autocast_dtype: str | torch.dtype | None = None,
        in_flight_updates: bool = False,
    ):
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.autocast_dtype = resolve_dtype(autocast_dtype, self.device) if autocast_dtype else None
        if self.autocast_dtype is torch.float32:
            self.autocast_dtype = None  # fp32 "autocast" is plain fp32
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self._tokenizer = tokenizer
        self.version = 0
        self.pad_id = _pad_id(tokenizer)
        self.eos_ids = eos_token_ids(tokenizer, model.generation_config, "TransformersEngine")
        self.vocab_size = model.get_input_embeddings().num_embeddings
        text_config = model.config.get_text_config()
        self.max_length = text_config.max_position_embeddings
        self.image_token_id = getattr(model.config, "image_token_id", None)  # vision-language models
        vision_config = getattr(model.config, "vision_config", None)
        self.merge_size = int(getattr(vision_config, "spatial_merge_size", 1) or 1)
        self.vision = None  # a VisionProcessor for this model's prompts (set by whoever builds the engine)
        placeholders = [getattr(model.config, k, None) for k in ("image_token_id", "video_token_id")]
        placeholders = [int(t) for t in placeholders if t is not None and t < self.vocab_size]
        self._never = torch.tensor(placeholders, device=self.device) if placeholders else None
        # transformers renamed the forward's cache argument (past_key_values -> cache, 5.2x); the old name
        # warns until it is removed, so pass whichever this model's forward declares.
        forward_args = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        # One token a row per step through DecodeStep (Llama-family models), else the model's forward.
        self.decode_step, why_not = DecodeStep.for_model(self.model)
        if self.decode_step is None:
            log.info("TransformersEngine: decoding through %s.forward (%s)", type(model).__name__, why_not)
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._lock = threading.Lock()
        self.in_flight_updates = in_flight_updates
        self._incoming: tuple[dict[str, torch.Tensor], int] | None = None  # weights for the running batch
        self._incoming_cv = threading.Condition()
        self._updating = threading.Lock()  # one in-flight update at a time
        self.decode_steps = 0  # tokens decoded per row so far, all calls (a test waits on it)
        self.in_flight_loads = 0  # updates loaded inside a running batch
        # Run one torch op on the constructing (usually the main) thread: when the first op of the process
        # ran on a worker thread instead (a server's request thread), decoding there was ~10x slower on CPU.
        torch.ones(8, 8) @ torch.ones(8, 8)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float32",
        seed: int | None = None,
        autocast_dtype: str | torch.dtype | None = None,
    ) -> TransformersEngine:
        dev = resolve_device(device)
        model = load_causal_lm(path, dtype=resolve_dtype(dtype, dev), device=dev)
        return cls(
            model,
            load_tokenizer(path),
            device=dev,
            dtype=model.dtype,
            seed=seed,
            autocast_dtype=autocast_dtype,
        )

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None = None,
        media: Sequence[PromptImages | None] | None = None,
    ) -> list[list[Generation]]:
        """``params.n`` generations per prompt, in prompt order (see ``RolloutModel.generate``).

        ``seed``: sample this call with its own generator seeded so (the engine's generator is left as it
        was), e.g. an endpoint request's ``seed``: the same seed, prompts, parameters and weights give the
        same samples. A seed is an int in [-2**63, 2**64). ``media[i]``: the images of ``prompts[i]`` (a
        vision-language model; ``None`` for a prompt without images)."""
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        check_prompts(prompts, self.max_length, self.vocab_size)
        media = self._checked_media(prompts, media)
        generator = self.generator
        if seed is not None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
        with self._lock, torch.inference_mode():
            responses, logprobs, reasons, versions = self._decode(prompts, params, generator, media)
        stopper = StopChecker(params, self.eos_ids, self._tokenizer)
        texts = self._tokenizer.batch_decode(responses, skip_special_tokens=True)
        out: list[list[Generation]] = []
        for i, prompt in enumerate(prompts):
            rows = range(i * params.n, (i + 1) * params.n)
            out.append(
                [
                    Generation(
                        prompt_ids=tuple(prompt),
                        response_ids=tuple(responses[r]),
                        logprobs=tuple(logprobs[r]),
                        finish_reason=reasons[r],
                        text=stopper.final_text(texts[r]),
                        versions=tuple(versions[r]),
                    )
                    for r in rows
                ]
            )
        return out

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` into the weights in place (any device/dtype) and set ``version``.

        Keys and shapes must match the model's exactly (checked before anything is copied, so a rejected
        update leaves the weights untouched). Tied weights (``lm_head.weight`` tied to the embeddings) may be
        left out, as safetensors checkpoints do. Tensors that are the engine's own (an engine that samples
        from the trainer's weights, ``launch/build.py``'s "share") are in place already: only the version
        moves.
        """
        own = self.model.state_dict()
        full = checked_state_dict(
            state_dict, own, self.model.all_tied_weights_keys, version, type(self.model).__name__
        )
        if same_tensors(full, own):
            with self._lock:
                self.version = version
            return
        if not self.in_flight_updates:
            with self._lock, torch.no_grad():
                self.model.load_state_dict(full, strict=True)
                self.version = version
            return
        with self._updating:
            with self._incoming_cv:
                self._incoming = (full, version)
            while True:
                if self._lock.acquire(blocking=False):  # no batch running: load them here
                    try:
                        self._load_incoming()
                    finally:
                        self._lock.release()
                with self._incoming_cv:  # else the running batch's decode loop loads them at its next token
                    if self._incoming is None:
                        return
                    self._incoming_cv.wait(timeout=0.005)
                    if self._incoming is None:
                        return

    def _load_incoming(self) -> bool:
        """Load the weights ``update_weights`` handed over, if any (the caller holds ``_lock``)."""
        with self._incoming_cv:
            if self._incoming is None:
                return False
            (full, version), self._incoming = self._incoming, None
            with torch.no_grad():
                self.model.load_state_dict(full, strict=True)
            self.version = version
            self._incoming_cv.notify_all()
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def holds_weights(self, state_dict: Mapping[str, torch.Tensor]) -> bool:
        """Whether ``state_dict``'s tensors are the engine's own (an engine over the trainer's weights):
        loading them changes nothing and there is no copy to verify (``sync/memory.py``)."""
        return same_tensors(state_dict, self.model.state_dict())

    @property
    def weights_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def metrics(self) -> dict[str, float]:
        """With in-flight updates: how many weight loads happened inside a running batch (all calls)."""
        return (
            {"rollout/in_flight_weight_loads": float(self.in_flight_loads)} if self.in_flight_updates else {}
        )

    def weights_checksum(self) -> str:
        """A checksum of the weights as they are. With in-flight updates it does not wait for a running batch:
        the weights change only when an update is handed over, which holds ``_updating`` (so a sync's check
        right after its update reads the weights it loaded while the batch goes on)."""
        from trivium.models.weights import weights_checksum

        with self._updating if self.in_flight_updates else self._lock:
            return weights_checksum(self.model.state_dict())

    def sampler_state(self) -> dict:
        """The sampling RNG: with the same weights, what a resumed run needs to sample the same tokens.

        The weights version is not part of it: it belongs to whoever loads the weights.
        """
        return {"generator": self.generator.get_state()}

    def load_sampler_state(self, state: dict) -> None:
        if "generator" not in state:  # saved by another engine (vLLM keeps no RNG state)
            log.warning(
                "transformers engine: the saved sampler state (%s) is from another engine; sampling continues "
                "from this run's seed, so the resumed run is not bit-exact",
                state.get("engine", "unknown"),
            )
            return
        with self._lock:  # after a batch still running (one sent by an explorer that has since died)
            self.generator.set_state(state["generator"])

    # ------------------------------------------------------------------------------------------ decode loop
    def _decode(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator,
        media: list[PromptImages | None] | None = None,
    ) -> tuple[list[list[int]], list[list[float]], list[FinishReason], list[list[int]]]:
        """Sample ``params.n`` responses per prompt; rows are prompt-major (row ``i * n + j``). Also the
        weights version that sampled each token (more than one where an in-flight update came)."""
        n_rows = len(prompts) * params.n
        stopper = StopChecker(params, self.eos_ids, self._tokenizer)
        budgets = [min(params.max_tokens, self.max_length - len(p)) for p in prompts for _ in range(params.n)]
        cache, logits, attention, next_pos = self._prefill(prompts, params.n, max(budgets), media)

        responses: list[list[int]] = [[] for _ in range(n_rows)]
        logprobs: list[list[float]] = [[] for _ in range(n_rows)]
        versions: list[list[int]] = [[] for _ in range(n_rows)]
        reasons: list[FinishReason] = ["length"] * n_rows
        alive = list(range(n_rows))  # global row of each row of the running batch
        version = self.version  # of the weights that computed ``logits``
        while True:
            tokens, token_logprobs = sample_next(logits, params, generator, self._never)
            self.decode_steps += 1
            keep: list[int] = []
            for i, (row, tok, lp) in enumerate(zip(alive, tokens.tolist(), token_logprobs.tolist())):
                responses[row].append(tok)
                logprobs[row].append(lp)
                versions[row].append(version)
                reason = stopper.finish_reason(responses[row], budgets[row])
                if reason is None:
                    keep.append(i)
                else:
                    reasons[row] = reason
            if not keep:
                return responses, logprobs, reasons, versions
            if len(keep) < len(alive):  # compact: finished rows leave the batch and the cache
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                attention, next_pos, tokens = attention[index], next_pos[index], tokens[index]
                alive = [alive[i] for i in keep]
            if self._incoming is not None and self._load_incoming():
                # new weights mid-batch: every live row's prompt and response so far prefilled again under them
                self.in_flight_loads += 1
                version = self.version
                rows = [prompts[row // params.n] + responses[row] for row in alive]
                left = max(budgets[row] - len(responses[row]) for row in alive)
                row_media = None if media is None else [media[row // params.n] for row in alive]
                cache, logits, attention, next_pos = self._prefill(rows, 1, left, row_media)
                continue
            attention = torch.cat([attention, attention.new_ones(len(alive), 1)], dim=1)
            logits = self._step(tokens, attention, next_pos, cache)
            next_pos = next_pos + 1

    def _checked_media(
        self, prompts: list[list[int]], media: Sequence[PromptImages | None] | None
    ) -> list[PromptImages | None] | None:
        """``media`` as a list aligned with ``prompts``, None when no prompt has images; each prompt's image
        placeholders must match its images' visual tokens."""
        if media is None or all(m is None or not m.refs for m in media):
            return None
        if len(media) != len(prompts):
            raise ValueError(f"generate(): {len(media)} media entries for {len(prompts)} prompts")
        if self.image_token_id is None:
            raise ValueError(
                f"this rollout model ({type(self.model).__name__}) takes no images: give image tasks a "
                "vision-language model (a folder with a vision_config, e.g. `trivium make-tiny --vlm`)"
            )
        for i, (prompt, m) in enumerate(zip(prompts, media)):
            placeholders = sum(1 for t in prompt if t == self.image_token_id)
            expected = 0 if m is None else int(m.image_grid_thw.prod(dim=1).sum()) // self.merge_size**2
            if placeholders != expected:
                raise ValueError(
                    f"prompt {i} holds {placeholders} image placeholder tokens and its images give {expected} "
                    "visual tokens: build image prompts with VisionProcessor.expand (ModelHandle.chat does)"
                )
        return [m if m is not None and m.refs else None for m in media]

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _forward(self, *, cache: DynamicCache, **inputs: torch.Tensor | int):
        """One forward pass of the model with the KV cache, under autocast when configured."""
        with self._autocast():
            return self.model(**inputs, use_cache=True, **{self._cache_arg: cache})

    def _step(
        self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Next-token logits after one new token a row: ``DecodeStep`` where the model has one, else the
        model's forward."""
        if self.decode_step is not None:
            with self._autocast():
                return self.decode_step(tokens, attention, positions, cache)
        out = self._forward(
            input_ids=tokens[:, None], attention_mask=attention, position_ids=positions[:, None], cache=cache
        )
        return out.logits[:, -1]

    def _prefill(
        self, prompts: list[list[int]], n: int, max_new: int, media: list[PromptImages | None] | None = None
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run each distinct prompt (with its images) once and expand its cache rows to the ``len(prompts) * n``
        samples.

        Returns the cache (room for ``max_new`` more tokens per row), next-token ``logits [R, V]``,
        ``attention [R, L]`` (0 on left padding) and the position of each row's next token ``next_pos [R]``.
        """
        distinct: dict[tuple, int] = {}
        images: list[PromptImages] = []  # of the distinct prompts that have images, in their order
        source: list[int] = []
        for i, p in enumerate(prompts):
            key = (tuple(p), media[i].refs if media is not None and media[i] is not None else ())
            if key not in distinct:
                distinct[key] = len(distinct)
                if key[1]:
                    images.append(media[i])
            source.extend([distinct[key]] * n)
        width = max(len(p) for p, _ in distinct)
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(distinct), width), dtype=torch.long)
        for u, (p, _) in enumerate(distinct):
            ids[u, width - len(p) :] = torch.tensor(p)
            attention[u, width - len(p) :] = 1
        ids, attention = ids.to(self.device), attention.to(self.device)
        image_inputs = {}
        if images:  # M-RoPE: image tokens get (t, h, w) positions; the text after them t + the image's delta
            image_inputs = {
                "pixel_values": torch.cat([m.pixel_values for m in images]).to(self.device),
                "image_grid_thw": torch.cat([m.image_grid_thw for m in images]).to(self.device),
            }
            rope = _rope_index(self.model)
            positions3, _ = rope(
                ids,
                mm_token_type_ids=(ids == self.image_token_id).int(),
                image_grid_thw=image_inputs["image_grid_thw"],
                attention_mask=attention,
            )
            image_inputs["position_ids"] = positions3
            positions = positions3[0]  # the text positions after the last image: all three are equal
        else:
            positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        # Full-attention layers get a reserved buffer (others, e.g. sliding window, keep their class), sized
        # for 64 new tokens and doubled as rows grow: a long max_tokens reserves nothing that is not used.
        reserve = (width + min(max_new, 64), width + max_new)
        cache.layers = [
            ReservedLayer(*reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers
        ]
        out = self._forward(
            input_ids=ids,
            attention_mask=attention,
            cache=cache,
            logits_to_keep=1,
            **({"position_ids": positions} | image_inputs),
        )
        index = torch.tensor(source, device=self.device)
        if source != list(range(len(distinct))):  # repeats (n > 1) or duplicate prompts
            cache.batch_select_indices(index)
        return cache, out.logits[index, -1], attention[index], positions[index, -1] + 1


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into a buffer with room for ``capacity`` tokens:
    ``update`` writes the new states into place; a full buffer is replaced by one twice as large (at most
    ``max_capacity`` when that is enough), so the copies cost O(final length) in all. ``keys``/``values``
    stay ``[batch, heads, length, head_dim]`` tensors, as attention expects."""

    def __init__(self, capacity: int, max_capacity: int | None = None):
        super().__init__()
        self.capacity = capacity
        self.max_capacity = max_capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._keys = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[3]))
        self._values = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[3]))
        self.length = 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            grown = 2 * self._keys.shape[-2]
            self._resize(max(end, min(grown, self.max_capacity) if self.max_capacity else grown))
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop(n): pass a negative number of tokens to remove")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def reset(self) -> None:
        self.length = 0
        super().reset()

    def _resize(self, capacity: int) -> None:
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def _views(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]


def _rope_index(model: PreTrainedModel):
    """The model's own M-RoPE position function (``get_rope_index`` of Qwen2-VL's inner model)."""
    for owner in (model, getattr(model, "model", None)):
        if owner is not None and hasattr(owner, "get_rope_index"):
            return owner.get_rope_index
    raise ValueError(
        f"{type(model).__name__} takes images but has no get_rope_index: not a Qwen2-VL family model"
    )


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Padding never reaches attention (masked out), so any valid id works; prefer pad, then eos."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0
