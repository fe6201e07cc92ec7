"""The trainer: one batch of experiences in, one or more optimizer steps out.

One step, in order: collate → recompute old log-probs (and reference log-probs when the KL term is on)
→ advantages, computed once for the whole batch → for each epoch and mini-batch: micro-batch
forward/backward with losses divided by mini-batch-wide denominators (so the result does not depend on
the micro-batch size) → clip → AdamW → schedule.

Old log-probs are recomputed here rather than taken from the rollout engine: the engine's numbers ride
along only to measure the training-inference mismatch, logged every step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trivium.algorithm import (
    ADVANTAGE_FNS,
    AdvantageInputs,
    PolicyLossInputs,
    actor_loss,
    loss_scale,
)
from trivium.algorithm.advantages_critic import gae_with_returns
from trivium.algorithm.aggregation import sequence_sums
from trivium.algorithm.policy_losses import mini_batch_rule
from trivium.algorithm.registry import POLICY_LOSS_FNS
from trivium.algorithm.rewards_shaping import (
    AdaptiveKLController,
    FixedKLController,
    kl_penalty_token_rewards,
    outcome_token_rewards,
    overlong_penalty,
)
from trivium.config.schema import OverlongPenaltyConfig, TrainerConfig
from trivium.models.vision import VisionProcessor
from trivium.monitor.phases import PhaseTimer
from trivium.trainer.compiling import compile_decoder_layers
from trivium.trainer.critic import Critic
from trivium.trainer.guard import NumericGuard
from trivium.trainer.layout import plan_shared_rows, why_not_shared
from trivium.trainer.logprobs import batched_logprobs, forward_logprobs, rows_by_length
from trivium.trainer.model_io import SHARDS_DIR, export_weights, save_model
from trivium.trainer.optim import Optimization
from trivium.trainer.parallel import Parallel, micro_rows
from trivium.trainer.precision import choose_precision, model_probe
from trivium.trainer.recompute import recompute_decoder_layers
from trivium.trainer.spec import AlgorithmSpec
from trivium.types import Experience, TrainBatch, collate

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Passes:
    """The forward passes of one step before any update, ``[R, L]`` each (None: not needed, or for ``old``
    with one update: taken from the training forward itself)."""

    old: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    teacher: torch.Tensor | None = None
    values: torch.Tensor | None = None


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        algorithm: AlgorithmSpec,
        *,
        pad_token_id: int,
        total_steps: int,
        temperature: float = 1.0,
        max_response_length: int = 1,
        ref_model: torch.nn.Module | None = None,
        teacher_model: torch.nn.Module | None = None,
        critic: Critic | None = None,
        kl_penalty: AdaptiveKLController | FixedKLController | None = None,
        kl_penalty_estimator: str = "k1",
        overlong: OverlongPenaltyConfig | None = None,
        seed: int = 0,
        parallel: Parallel | None = None,
        reference_is_base: bool = False,
        vision: VisionProcessor | None = None,
    ):
        """``parallel``: how the model is laid out over ranks (default: one rank, the model's device);
        ``reference_is_base``: ``model`` is a LoRA (PEFT) model whose base, adapters disabled, is the
        reference (no ``ref_model`` copy); ``vision``: a vision-language model's image processor and store,
        which turns experiences' image references into the model's image inputs."""
        has_reference = ref_model is not None or reference_is_base
        if (algorithm.kl_coef > 0 or kl_penalty is not None) and not has_reference:
            raise ValueError(
                "a KL term (kl_loss.coef or kl_penalty.coef > 0) needs a reference model; pass ref_model"
            )
        for name, model_needed, given in (
            ("teacher_logprobs", "teacher_model", teacher_model),
            ("values", "critic", critic),
        ):
            if name in algorithm.advantage_requires and given is None:
                raise ValueError(f"advantage '{algorithm.advantage_fn}' needs {name}: pass {model_needed}")
        self.parallel = parallel or Parallel(next(model.parameters()).device)
        self.device = self.parallel.device
        self.precision = choose_precision(
            cfg.precision,
            self.device,
            next(model.parameters()).dtype,
            # ranks must agree: one rank's timing is not another's, so several ranks take the hardware's word
            model_probe(model, self.device) if self.parallel.world_size == 1 else None,
            head_grad_precision=cfg.head_grad_precision,
        )
        if self.parallel.is_leader:
            log.info("%s", self.precision.describe(cfg.precision))
        self.precision.prepare_attention(model, ref_model, teacher_model)
        self._unshared = why_not_shared(
            cfg.pack_length,
            vision is not None,
            (model, ref_model, teacher_model, None if critic is None else critic.model.backbone),
        )
        if cfg.share_prompts is True and self._unshared is not None:
            raise ValueError(
                f"trainer.share_prompts: true, but {self._unshared}: set trainer.share_prompts to auto or false"
            )
        if cfg.gradient_checkpointing:  # before compile, which then traces the recomputing layers
            recompute_decoder_layers(model)
            if critic is not None:
                recompute_decoder_layers(critic.model.backbone, "the critic")
        if cfg.compile:  # before the strategy's wrapping, as torchtitan does for FSDP2 (compile, then shard)
            compile_decoder_layers(model, self.precision.name, self.device.type)
        self.model = self.parallel.wrap(model)
        self.cfg = cfg
        self.algorithm = algorithm
        self._loss_rule = mini_batch_rule(POLICY_LOSS_FNS.get(algorithm.policy_loss_fn))
        self.pad_token_id = pad_token_id
        self.vision = vision
        self.temperature = temperature if temperature > 0 else 1.0  # greedy rollouts report T=1 log-probs
        self.max_response_length = max_response_length
        self.ref_model = None if ref_model is None else self.parallel.wrap(ref_model, trainable=False)
        self.reference_is_base = reference_is_base
        self.teacher_model = teacher_model
        self.critic = critic
        if critic is not None:
            critic.set_precision(self.precision)
        self.kl_penalty = kl_penalty
        self.kl_penalty_estimator = kl_penalty_estimator
        self.overlong = overlong
        self.optim = Optimization(self.model, cfg, precision=self.precision)  # planned at step 1
        self.guard = NumericGuard(cfg.max_abs_reward, cfg.max_bad_steps)
        self.total_steps = total_steps
        self.step = 0
        self.observer = None  # called with each step's batch before the update (TrajectoryRecorder)
        self.timer = PhaseTimer(self.device)
        self.generator = torch.Generator().manual_seed(seed)

    def train_step(self, experiences: Sequence[Experience]) -> dict[str, float]:
        """One trainer step over ``experiences``: the log-prob passes the algorithm needs, the advantages,
        then ``ppo_epochs`` passes over the mini-batches; returns the step's metrics. A step whose rewards
        or advantages are not finite makes no update (``guard.py``) and still counts."""
        t0 = time.perf_counter()
        timer = self.timer = PhaseTimer(self.device)  # time/<phase> of this step (monitor/phases.py)
        experiences, dropped = self.guard.rewards(experiences)
        if not experiences:
            return self._skipped_step(t0, dropped, "every experience had a non-finite or absurd reward")
        self.model.eval()
        with timer("collate"):
            shared, layout = (
                (None, {})
                if self._unshared
                else plan_shared_rows(
                    experiences, self.cfg.share_prompts, self.cfg.max_tokens_per_micro_batch
                )
            )
            batch = collate(experiences, self.pad_token_id, self.cfg.pack_length, self._images, shared).to(
                self.device
            )
        minis = self._mini_batches(batch)
        self.optim.plan(self.total_steps * self.cfg.ppo_epochs * len(minis))
        passes = self._before_update(batch, single_update=self.cfg.ppo_epochs == 1 and len(minis) == 1)
        with timer("advantages"):
            advantages, returns, metrics = self._advantages(
                batch, passes.old, passes.ref, passes.teacher, passes.values
            )
            if self.algorithm.rollout_is_cap > 0 and passes.old is not None:  # else: in the update's pass
                advantages, m = self._rollout_correction(batch, passes.old, advantages)
                metrics.update(m)
        if not bool(torch.isfinite(advantages).all()):
            return self._skipped_step(t0, dropped, "the advantages are not finite")
        if self.observer is not None:  # monitor/trajectories.py: per-token records, before the update
            self.observer(
                self.step + 1, batch, experiences, advantages, lambda rows: self._rows_logprobs(batch, rows)
            )
        skipped_before = self.optim.skipped
        metrics.update(self._update_epochs(batch, minis, passes, advantages, returns))
        self.step += 1
        skipped = self.optim.skipped - skipped_before
        self.guard.step_done(
            self.step, f"{skipped} update(s) with a non-finite or absurd gradient norm" if skipped else None
        )
        metrics.update(self._step_metrics(batch, t0, skipped, dropped))
        return {**metrics, **layout}

    @property
    def _images(self):
        """Image references to model inputs (a vision-language policy), for ``collate``."""
        return None if self.vision is None else self.vision.row_media

    def _before_update(self, batch: TrainBatch, single_update: bool) -> _Passes:
        """The forward passes before any update: old log-probs, the reference's, the teacher's, the
        critic's values (each only when the algorithm reads it).

        With one update per batch (``single_update``) the policy is unchanged until that update, so the old
        log-probs are the training forward's own (detached): one forward pass fewer, the same numbers.
        Advantages that read old log-probs (KL penalty, distillation) need them first, so they get the
        extra pass; the rollout correction's per-token weight does not (``_update`` takes it from the
        training forward's detached log-probs)."""
        timer, passes = self.timer, _Passes()
        early_old = (
            "old_logprobs" in self.algorithm.advantage_requires
            or self.kl_penalty is not None
            or self._loss_rule is not None  # it reads the whole mini-batch's old log-probs first
        )
        if self.algorithm.needs_old_logprobs and (early_old or not single_update):
            with timer("old_logprobs"):
                passes.old = self._logprobs(self.model, batch)
        elif not self.algorithm.needs_old_logprobs:
            passes.old = torch.zeros_like(batch.rollout_logprobs)
        if self.ref_model is not None or self.reference_is_base:
            with timer("ref_logprobs"):
                passes.ref = self._reference_logprobs(batch)
        if self.teacher_model is not None:
            with timer("teacher_logprobs"):
                passes.teacher = self._logprobs(self.teacher_model, batch)
        if self.critic is not None:
            with timer("values"):
                passes.values = self.critic.values(batch, self._micro_rows(batch))
        return passes

    def _update_epochs(
        self, batch: TrainBatch, minis: list, passes: _Passes, advantages: torch.Tensor, returns
    ) -> dict[str, float]:
        """``ppo_epochs`` passes over the mini-batches (policy, and critic when there is one): the mean of
        each update's metrics, and the train/rollout log-prob mismatch of the first pass."""
        seen_lp = torch.zeros_like(batch.rollout_logprobs)  # log-probs of the first pass, for the mismatch
        sums: dict[str, float] = {}
        updates = 0
        train_policy = self.critic is None or self.step >= self.critic.warmup_steps
        for epoch in range(self.cfg.ppo_epochs):
            for rows in minis if epoch == 0 else self._mini_batches(batch):
                part = (
                    self._update(batch, rows, passes.old, passes.ref, advantages, seen_lp)
                    if train_policy
                    else {}
                )
                if self.critic is not None:
                    with self.timer("critic"):
                        micro = self._micro_rows(batch, rows.numel())
                        part.update(self.critic.update(batch, rows, passes.values, returns, micro))
                for k, v in part.items():
                    sums[k] = sums.get(k, 0.0) + v
                updates += 1
        metrics = {k: v / updates for k, v in sums.items()}
        if self.algorithm.needs_old_logprobs and train_policy:
            if passes.old is None:  # one update: every row's log-probs came from one rank's pass
                self.parallel.sum_(seen_lp)
            metrics.update(self._mismatch_metrics(batch, seen_lp if passes.old is None else passes.old))
        return metrics

    def _step_metrics(self, batch: TrainBatch, t0: float, skipped: int, dropped: int) -> dict[str, float]:
        metrics = {}
        if self.optim.scaler is not None:  # fp16: updates the loss scaler skipped so far, and its scale
            metrics["train/amp_overflows"] = float(self.optim.overflows)
            metrics["train/loss_scale"] = float(self.optim.scaler.get_scale())
        return {
            **metrics,
            "train/skipped_updates": float(skipped),
            "train/dropped_experiences": float(dropped),
            "train/lr": self.optim.lr,
            "train/step_seconds": time.perf_counter() - t0,
            "time/train": time.perf_counter() - t0,
            **self.timer.metrics(),
            "train/sequences": float(batch.num_seqs),
            "train/action_tokens": float(batch.loss_mask.sum()),
            "train/reward_mean": float(batch.rewards.mean()),
            **self.optim.footprint(),
        }

    def _skipped_step(self, t0: float, dropped: int, why: str) -> dict[str, float]:
        """A step that makes no update (see ``guard.py``); it still counts as a step."""
        self.step += 1
        self.guard.step_done(self.step, why)
        return {
            "train/skipped_steps": 1.0,
            "train/dropped_experiences": float(dropped),
            "train/step_seconds": time.perf_counter() - t0,
        }

    def _rollout_correction(self, batch: TrainBatch, old_lp: torch.Tensor, advantages: torch.Tensor):
        """Truncated importance sampling for the sampling policy: A ← A · min(π_old / π_rollout, cap).

        The trainer's old log-probs are the current weights' (ratio 1 at the first update), so samples
        drawn by older weights (an explorer running ahead) or by a mismatched engine would otherwise be
        trained on as if on-policy. The weight is detached and taken per token; tokens without rollout
        log-probs (expert demonstrations) keep weight 1. With one update per batch ``_update`` applies it
        to each micro-batch from its own forward (no extra pass; the trajectories then record the
        advantages before the weight); otherwise ``train_step`` applies it from the old log-probs' pass.
        """
        mask = batch.loss_mask
        if batch.is_expert is not None:
            mask = mask & ~batch.seq_to_tokens(batch.is_expert).bool()
        log_w = (old_lp - batch.rollout_logprobs).clamp(-20, 20)
        weight = torch.where(mask, torch.exp(log_w).clamp(max=self.algorithm.rollout_is_cap), 1.0).detach()
        capped = (torch.exp(log_w) > self.algorithm.rollout_is_cap) & mask
        n = mask.sum().clamp(min=1)
        return advantages * weight, {
            "rollout_is/weight_mean": float((weight * mask).sum() / n),
            "rollout_is/capped_fraction": float(capped.sum() / n),
        }

    def _logprobs(self, model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
        forward = self.parallel.unwrap(model)  # no gradients: no DDP hooks (FSDP2 keeps its own)
        with self.precision.autocast():
            return batched_logprobs(forward, batch, self._micro_rows(batch), self.temperature, self.parallel)

    @torch.no_grad()
    def _rows_logprobs(self, batch: TrainBatch, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies [len(rows), L] of ``rows`` of the batch under the weights now, the model
        in eval mode (a step's trajectory records, ``monitor/trajectories.py``)."""
        sub = batch.forward_rows(rows)
        model = self.parallel.unwrap(self.model)
        was_training = model.training
        model.eval()
        try:
            return forward_logprobs(model, sub, self.temperature, entropy=True)
        finally:
            model.train(was_training)

    def _micro_rows(self, batch: TrainBatch, rows: int | None = None) -> int:
        """Rows per forward pass over ``rows`` of the batch (default: all of them): ``micro_batch_size``,
        fewer where ``max_tokens_per_micro_batch`` says (every row of a batch has the batch's width, so a
        micro-batch holds rows x width tokens)."""
        share = math.ceil((batch.num_rows if rows is None else rows) / self.parallel.world_size)
        width = batch.input_ids.shape[1]
        return micro_rows(self.cfg.micro_batch_size, self.cfg.max_tokens_per_micro_batch, share, width)

    def _reference_logprobs(self, batch: TrainBatch) -> torch.Tensor | None:
        if self.reference_is_base:
            with self.parallel.unwrap(self.model).disable_adapter():
                return self._logprobs(self.model, batch)
        return None if self.ref_model is None else self._logprobs(self.ref_model, batch)

    def _advantages(self, batch, old_lp, ref_lp, teacher_lp, values):
        """Advantages ``[R, L]`` (and value targets when a critic is trained), computed once per batch."""
        metrics: dict[str, float] = {}
        rewards = batch.rewards
        if self.overlong is not None:
            penalty = overlong_penalty(
                batch.response_lengths,
                max_length=self.max_response_length,
                cache_length=self.overlong.cache_length,
                factor=self.overlong.factor,
            )
            rewards = rewards + penalty
            metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
        if self.kl_penalty is not None:
            token_rewards, m = kl_penalty_token_rewards(
                rewards,
                batch.loss_mask,
                batch.seq_index,
                old_lp,
                ref_lp,
                kl_coef=self.kl_penalty.value,
                estimator=self.kl_penalty_estimator,
            )
            metrics.update(m)
            observed = metrics.get("kl_penalty/kl_mean")
            if observed is not None:
                self.kl_penalty.update(observed, batch.num_seqs)
            metrics["kl_penalty/coef"] = float(self.kl_penalty.value)
        else:
            token_rewards = outcome_token_rewards(rewards, batch.loss_mask, batch.seq_index)
        seq_rewards = sequence_sums(token_rewards, batch.loss_mask, batch.seq_index, batch.num_seqs)
        if self.algorithm.advantage_fn is None:
            return torch.zeros_like(batch.rollout_logprobs), None, metrics
        inputs = AdvantageInputs(
            rewards=seq_rewards,
            group_ids=batch.group_ids,
            mask=batch.loss_mask,
            seq_index=batch.seq_index,
            token_rewards=token_rewards,
            values=values,
            old_logprobs=old_lp,
            ref_logprobs=ref_lp,
            teacher_logprobs=teacher_lp,
            run_ids=batch.run_ids,
            turns=batch.turns,
            states=batch.states,
        )
        if self.critic is not None:
            adv, returns, m = gae_with_returns(inputs, **self.algorithm.advantage_args)
            metrics.update(m)
            return adv.detach(), returns.detach(), metrics
        adv, m = ADVANTAGE_FNS.get(self.algorithm.advantage_fn)(inputs, **self.algorithm.advantage_args)
        metrics.update(m)
        return adv.detach(), None, metrics

    def _mini_batches(self, batch: TrainBatch) -> list[torch.Tensor]:
        """Row index sets, one per optimizer step; shuffled when there is more than one."""
        n = batch.num_rows
        size = self.cfg.mini_batch_size or batch.num_seqs  # in sequences
        if (
            n != batch.num_seqs
        ):  # rows hold several sequences (packed, shared prompts): convert with the ratio
            size = max(1, round(size * n / batch.num_seqs))
        if size >= n:
            return [torch.arange(n)]
        order = torch.randperm(n, generator=self.generator)
        return [order[i : i + size] for i in range(0, n, size)]

    def _update(self, batch, rows, old_lp, ref_lp, advantages, seen_lp) -> dict[str, float]:
        """One optimizer step over the mini-batch ``rows``, accumulated over micro-batches.

        ``old_lp`` None means: use this pass's own detached log-probs (single update per batch).
        """
        mask = batch.loss_mask[rows]
        expert = None if batch.is_expert is None else batch.seq_to_tokens(batch.is_expert).bool()
        scale = loss_scale(
            mask,
            batch.seq_index[rows],
            float(self.max_response_length),
            None if expert is None else expert[rows],
        )
        # Dropout stays off for RL (old and new log-probs must come from the same function); SFT trains
        # in train mode.
        self.model.train(not self.algorithm.needs_old_logprobs)
        keep = None  # the loss's mini-batch rule (M2PO's mask) sees every row of the mini-batch at once
        if self._loss_rule is not None and old_lp is not None:
            keep = torch.zeros_like(batch.loss_mask)
            keep[rows] = self._loss_rule(
                old_lp[rows], batch.rollout_logprobs[rows], mask, **self.algorithm.policy_loss_args
            )
        sums: dict[str, float] = {}
        total_loss = 0.0
        # rows of similar length share a micro-batch, which forward_logprobs trims to their own width
        rows = rows_by_length(batch.loss_mask, rows)
        passes = list(self.parallel.passes(rows, self._micro_rows(batch, rows.numel())))
        timer = self.timer
        for n, (idx, real) in enumerate(passes):
            sub = batch.select_rows(idx)
            with timer("forward_backward"), self.parallel.accumulating(self.model, last=n == len(passes) - 1):
                with self.precision.autocast():
                    lp, entropy = forward_logprobs(
                        self.model, sub, self.temperature, entropy=self.algorithm.entropy_coef > 0
                    )
                adv, corrected = advantages[idx], {}
                if old_lp is None and self.algorithm.rollout_is_cap > 0:  # one update: this pass is π_old
                    adv, corrected = self._rollout_correction(sub, lp.detach(), adv)
                loss, m = actor_loss(
                    PolicyLossInputs(
                        logprobs=lp,
                        old_logprobs=lp.detach() if old_lp is None else old_lp[idx],
                        advantages=adv,
                        mask=sub.loss_mask,
                        seq_index=sub.seq_index,
                        rollout_logprobs=sub.rollout_logprobs,
                        ref_logprobs=None if ref_lp is None else ref_lp[idx],
                        is_expert=None if expert is None else expert[idx],
                        step=self.step,
                        keep=None if keep is None else keep[idx],
                    ),
                    policy_loss=self.algorithm.policy_loss_fn,
                    policy_loss_args=self.algorithm.policy_loss_args,
                    aggregation=self.algorithm.aggregation,
                    scale=scale,
                    kl_estimator=self.algorithm.kl_estimator if self.algorithm.kl_coef > 0 else None,
                    kl_coef=self.algorithm.kl_coef,
                    ref_logprobs=None if ref_lp is None else ref_lp[idx],
                    entropy=entropy,
                    entropy_coef=self.algorithm.entropy_coef,
                )
                # a filler pass (a rank short of rows) only joins the collectives: weight 0 everywhere,
                # the same metric keys as a real pass, so that every rank sums the same keys
                share = 1.0 if real else 0.0
                self.optim.backward(loss * share)
            if real:
                seen_lp[idx] = lp.detach()
            total_loss += share * float(loss.detach())
            # loss/* entries are already this micro-batch's share of the mini-batch loss: add them up;
            # other metrics are micro-batch means: weight them by the micro-batch's share of tokens.
            weight = share * float(sub.loss_mask.sum()) / max(1.0, scale.num_tokens)
            for k, v in {**m, **corrected}.items():
                sums[k] = sums.get(k, 0.0) + float(v) * (share if k.startswith("loss/") else weight)
        sums = self.parallel.sum_floats({**sums, "train/loss": total_loss})
        with timer("optimizer"):
            grad_norm = self.optim.step()
        self.model.eval()
        return {**sums, "train/grad_norm": grad_norm}

    @staticmethod
    def _mismatch_metrics(batch: TrainBatch, old_lp: torch.Tensor) -> dict[str, float]:
        """Rollout-engine vs trainer log-probs on the same tokens (training-inference mismatch).

        Expert demonstrations have no rollout log-probs and are left out.
        """
        mask = batch.loss_mask
        if batch.is_expert is not None:
            mask = mask & ~batch.seq_to_tokens(batch.is_expert).bool()
        if not bool(mask.any()):
            return {}
        diff = (batch.rollout_logprobs - old_lp)[mask]
        log_ratio = (old_lp - batch.rollout_logprobs)[mask]
        return {
            "mismatch/logprob_abs_mean": float(diff.abs().mean()),
            "mismatch/logprob_abs_max": float(diff.abs().max()),
            # k3 estimate of KL(rollout || trainer) per token
            "mismatch/kl_k3": float((torch.exp(log_ratio) - log_ratio - 1).mean()),
        }

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy's weights as a plain state dict (see ``model_io.export_weights``); ``dtype``: cast
        floating-point tensors to it (the receiving engine's); None keeps the trainer's."""
        return export_weights(self.model, self.parallel, dtype)

    # --- state for checkpoints ------------------------------------------------------------------
    def save_model(self, folder: Path) -> None:
        """The checkpoint's model part (``model_io.save_model``); collective with several ranks."""
        save_model(self.model, self.parallel, self.optim.optimizer, folder)

    def state_dict(self) -> dict[str, Any]:
        """Schedule and RNG state, the optimizer's (one rank; multi-rank strategies keep it in the
        checkpoint's shards), the critic (weights and optimizer) and the KL controller."""
        optim = self.optim.state_dict(include_optimizer=not self.parallel.sharded)
        state = {"step": self.step, **optim, "generator": self.generator.get_state()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        if self.kl_penalty is not None:
            state["kl_penalty"] = self.kl_penalty.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        """Continue from ``state_dict()`` of the checkpoint ``folder`` (the model's weights are loaded
        separately, from its ``model/``; multi-rank strategies read the optimizer from its shards)."""
        self.step = state["step"]
        shards = None if not self.parallel.sharded else Path(folder) / SHARDS_DIR
        self.optim.load_state_dict(
            state, load_optimizer=None if shards is None else self._load_sharded_optimizer(shards)
        )
        self.generator.set_state(state["generator"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        if self.kl_penalty is not None:
            self.kl_penalty.load_state_dict(state["kl_penalty"])

    def _load_sharded_optimizer(self, folder: Path):
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{folder} is missing: the checkpoint was written by trainer.strategy single, whose optimizer "
                f"state cannot be loaded by strategy {self.parallel.name}; resume with strategy single"
            )
        return lambda optimizer: self.parallel.load_sharded(self.model, optimizer, folder)
