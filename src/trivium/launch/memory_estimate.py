"""Memory a stage needs, per role, from the model's shape and the stage's batch shapes (``trivium doctor``).

Every figure is bytes of tensors, counted from shapes and dtypes (docs/observability.md gives the formulas):

- trainer: the policy's weights, its gradients (trainable weights, model dtype), AdamW's two moments (model
  dtype), frozen copies (reference model), and the activations one micro-batch keeps for its backward pass:
  per token and decoder layer ``ACT_PER_TOKEN_LAYER`` vectors (below), plus the head's logits. Only the
  positions that predict a loss token (the response) go through the head (``trainer/logprobs.py``), a chunk
  of ``HEAD_CHUNK_VALUES`` logits at a time where the head allows it (``ChunkedLogProbs``: one chunk's
  float32 logits, turned into their gradient in place; with ``trainer.head_grad_precision: autocast`` under
  autocast the backward's gradient products take bf16 copies of a block's gradient and of a block of the
  weight and make its gradient in bf16: about twice that again); otherwise (an entropy bonus, a bf16 head)
  the logits, their gradient and the softmax in float32 for every loss token (3 x loss tokens x vocab);
  a model the trainer cannot project that way (logit soft-capping, no ``logits_to_keep``) gets logits
  for every position. Tied embeddings add one more ``vocab x hidden`` gradient while the head's and the
  embedding's parts of the shared matrix's gradient are summed;
- rollout (transformers engine, in the same process): its own copy of the weights (rollout dtype; none where
  it samples from the trainer's own tensors, ``build.why_rollout_copies_weights``, in the weights' dtype), the KV
  cache of every sequence in flight at its longest (2 x layers x kv width x tokens), and the prefill's
  activations (one layer's MLP at a time, logits of the last position only);
- the run's peak: weights and optimizer state stay for the whole step; training (activations and gradients:
  both where a step's passes accumulate gradients; where one pass makes an update, the larger of the
  gradients and the activations with the head's gradient, ``Shapes.grads_meet_activations``) and sampling
  (KV cache) alternate (``synchronizer.sync_offset`` 0), so the peak holds the larger of the two.
  With ``sync_offset`` > 0 the explorer samples while the trainer trains, and the peak holds both.

The per-token activation count of a decoder layer (Qwen2/Llama, autograd's saved tensors) is, in vectors:
the layer's input and its normalised copy (2h), q after rotary, k and v (h + 2 kv), k and v repeated to
every head for attention (2h), attention's output (h), the second norm's input and output (2h), the MLP's
gate, up, activated gate and product (4i): ``9h + 2kv + 4i``.
With ``trainer.gradient_checkpointing`` a layer keeps its input (``h``), attention's output (heads x head
dim) and its log-sum-exp (one float32 a head), and one layer at a time holds the full set, while its
backward recomputes it.

Under bf16 autocast (``trainer.precision`` bf16 with fp32 weights) the residual stream and the norms stay
fp32 and so do q and k after rotary (fp32 cos/sin promote them): ``5h + kv`` values of 4 bytes; the
products' outputs and the bf16 copies autocast makes of their inputs (three of the first norm's output,
two of the second's, q and k again for attention) are 2 bytes: ``9h + 2kv + 4i`` values. Per token and
layer that is ``38h + 8kv + 8i`` bytes against fp32's ``36h + 8kv + 16i``: less where the MLP is wider
than the model, as in every common architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# What the first train steps leave in the process beyond its tensors: tensors under 64 KiB come from
# malloc's heap, which keeps the pages it freed, plus the steps' Python objects. Measured as the growth of RSS
# across the first steps, less the optimizer state, at the ladder's 1M-25M rungs (benchmarks/ladder.py):
# 26-35 MiB; a constant, so it only matters for small models.
STEP_HEAP = 32 * 2**20


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a causal LM (from its transformers config; params counted exactly)."""

    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False  # the head shares the embedding matrix

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def act_per_token_layer(self) -> int:
        """Values a decoder layer keeps per token for backward (module docstring)."""
        return 9 * self.hidden + 2 * self.kv_width + 4 * self.intermediate

    def act_bytes_per_token_layer(self, weight_bytes: int, autocast: bool) -> int:
        """Bytes a decoder layer keeps per token for backward: every value in the weights' dtype, or under
        bf16/fp16 autocast (module docstring) ``5h + kv`` values in fp32 and ``9h + 2kv + 4i`` in 16 bits."""
        if not autocast:
            return self.act_per_token_layer() * weight_bytes
        h, kv, i = self.hidden, self.kv_width, self.intermediate
        return 4 * (5 * h + kv) + 2 * (9 * h + 2 * kv + 4 * i)


@dataclass(frozen=True)
class Shapes:
    """A stage's batch shapes (``config_doctor.derive``)."""

    experiences: int  # sequences trained per step
    rows_per_micro: int  # rows of one micro-batch on one rank
    seq_len: int  # longest prompt + longest response, tokens
    loss_tokens: int  # tokens of a row whose logits the trainer computes: the longest response (or seq_len)
    in_flight: int  # sequences the rollout engine samples at once
    rollout_seq: int  # their longest prompt + max_tokens
    trainable: int  # trainable parameters (LoRA: the adapters)
    frozen_copies: int  # frozen full copies of the policy in the trainer (reference model)
    critic: bool = False
    rollout_engine: bool = True  # a transformers engine in this process
    rollout_shares_weights: bool = False  # ... that samples from the trainer's tensors when of their dtype
    overlap: bool = False  # sampling and training at the same time (sync_offset > 0)
    head_chunk: int = 0  # loss tokens per chunk of the vocabulary head (ChunkedLogProbs); 0: not chunked
    head_low_products: bool = (
        False  # its backward's products in autocast's dtype (trainer.head_grad_precision)
    )
    moment_bytes: int = 0  # bytes of each of AdamW's two moments a parameter; 0: the weights' (bf16: 2)
    shared_rows: bool = False  # rows of a group's samples with their prompt once (trainer.share_prompts)
    recompute: bool = False  # decoder layers recompute their activations in backward (gradient_checkpointing)
    rows_per_update: int = (
        0  # rows a rank trains between two optimizer steps (its mini-batch share); 0: unknown
    )
    grads_kept: bool = False  # the gradients live outside the passes too (DDP's buckets)

    @property
    def grads_meet_activations(self) -> bool:
        """Whether a pass's activations share the process with the whole gradients: several passes an
        optimizer step accumulate into them, and DDP's buckets keep them. With one pass an update (the
        optimizer sets them to None after each step), the gradients grow as backward frees the activations
        layer by layer, so the pass holds the larger of the whole gradients and the activations with the
        head's gradient (backward's first), not both."""
        return self.grads_kept or not self.rows_per_update or self.rows_per_update > self.rows_per_micro


@dataclass
class Estimate:
    """Bytes per role and part; ``peak`` is the run's process at its fullest."""

    parts: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> part -> bytes
    steady: float = 0.0  # weights and optimizer state: there the whole step
    heap: float = 0.0  # what the train steps leave in malloc's heap (STEP_HEAP)
    train_transient: float = 0.0  # gradients and activations, while training
    rollout_transient: float = 0.0  # KV cache and prefill, while sampling
    overlap: bool = False  # sampling and training at the same time

    @property
    def peak(self) -> float:
        if self.overlap:
            return self.steady + self.heap + self.train_transient + self.rollout_transient
        return self.steady + self.heap + max(self.train_transient, self.rollout_transient)


def estimate(
    shape: ModelShape,
    s: Shapes,
    model_dtype: str,
    rollout_dtype: str,
    shards: int = 1,
    autocast: bool = False,
) -> Estimate:
    """Bytes of rank 0's process (which holds the explorer too); ``shards``: FSDP2's world size, over which
    the trained weights, their gradients and the optimizer state are split (DDP keeps a full replica);
    ``autocast``: the trainer's passes run under bf16/fp16 autocast (``trainer.precision``)."""
    wb, rb = DTYPE_BYTES[model_dtype], DTYPE_BYTES[rollout_dtype]
    mb = s.moment_bytes or wb
    tokens = s.rows_per_micro * s.seq_len
    per_layer = shape.act_bytes_per_token_layer(wb, autocast)
    if s.recompute:  # the residual stream between the layers (weights' dtype, fp32 under autocast too),
        # attention's output (compute dtype) and log-sum-exp (fp32), and one layer's full set while its
        # backward recomputes it (trainer/recompute.py)
        kept = shape.hidden * wb + shape.heads * shape.head_dim * (2 if autocast else wb) + shape.heads * 4
        act = tokens * (shape.layers * kept + per_layer)
    else:
        act = tokens * shape.layers * per_layer
    if s.shared_rows:  # a row's additive [L, L] mask in the compute dtype, one the layers share (sdpa keeps
        # it for the backward; a boolean one it would copy in every layer: +650 MB at 2 x 4225 tokens, 8 layers)
        act += s.rows_per_micro * s.seq_len**2 * (2 if autocast else wb)
    head_tokens = s.rows_per_micro * min(s.loss_tokens, s.seq_len)
    if s.head_chunk:  # one chunk's logits, float32 (one buffer; log-sum-exp and the gradient are made in it)
        head = min(head_tokens, s.head_chunk) * shape.vocab * 4
        if (
            autocast and s.head_low_products
        ):  # the backward's bf16 operands: a block's gradient (half its logits' bytes), a block of
            # the weight and of the weight's gradient (backward_block: at most a chunk's values each)
            head *= 1.5
            head += 2 * min(shape.vocab * shape.hidden, s.head_chunk * shape.vocab) * 2
    else:  # logits, their gradient, the log-softmax's exp: float32, at the loss tokens only
        head = 3 * head_tokens * shape.vocab * 4
    if shape.tied and s.trainable >= shape.params:  # the shared matrix's second gradient, while it is added
        head += shape.vocab * shape.hidden * wb / shards
    trainer = {
        "weights": shape.params * wb * (1 / shards + s.frozen_copies),
        "gradients": s.trainable * wb / shards,
        "optimizer state": 2 * s.trainable * mb / shards,
        "activations": act + head,
        "step heap": STEP_HEAP,
    }
    if s.critic:  # PPO's value model, the policy's size: weights, gradients and AdamW's two moments (its
        trainer["critic"] = shape.params * (2 * wb + 2 * mb)  # activations, like the policy's, not counted)
    out = Estimate(overlap=s.overlap)
    out.parts["trainer"] = trainer
    # the critic's weights and moments stay; its gradients come and go with the policy's
    critic_grads = shape.params * wb if s.critic else 0.0
    out.steady = trainer["weights"] + trainer["optimizer state"] + trainer.get("critic", 0.0) - critic_grads
    out.heap = trainer["step heap"]
    if s.grads_meet_activations:
        out.train_transient = trainer["gradients"] + trainer["activations"] + critic_grads
    else:  # backward starts at the head: its weights' gradient is made while every activation is still held
        head_grad = shape.vocab * shape.hidden * wb / shards if s.trainable >= shape.params else 0.0
        out.train_transient = max(trainer["gradients"] + critic_grads, trainer["activations"] + head_grad)
    if s.rollout_engine:
        kv = s.in_flight * shape.layers * 2 * shape.kv_width * s.rollout_seq * rb
        # the prefill: one layer's hidden states and MLP at a time, for every sequence (logits: last only)
        prefill = s.in_flight * s.rollout_seq * (2 * shape.hidden + 3 * shape.intermediate) * rb
        rollout = {"KV cache": kv, "activations": prefill}
        if not (s.rollout_shares_weights and rollout_dtype == model_dtype):
            rollout = {"weights": shape.params * rb, **rollout}
        out.parts["rollout"] = rollout
        out.steady += rollout.get("weights", 0.0)
        out.rollout_transient = kv + prefill
    return out


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"
