"""The trainer: one batch of experiences in, one or more optimizer steps out.

One step, in order: collate → recompute old log-probs (and reference log-probs when the KL term is on)
→ advantages, computed once for the whole batch → for each epoch and mini-batch: micro-batch
forward/backward with losses divided by mini-batch-wide denominators (so the result does not depend on
the micro-batch size) → clip → AdamW → schedule.

Old log-probs are recomputed here rather than taken from the rollout engine: the engine's numbers ride
along only to measure the training-inference mismatch, logged every step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trivium.algorithm import (
    ADVANTAGE_FNS,
    AdvantageInputs,
    PolicyLossInputs,
    actor_loss,
    get_preset,
    loss_scale,
)
from trivium.config.schema import AlgorithmConfig, TrainerConfig
from trivium.trainer.logprobs import batched_logprobs, token_logprobs
from trivium.trainer.optim import build_optimizer, build_scheduler
from trivium.types import Experience, TrainBatch, collate


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm preset with the user's overrides applied: the parts the trainer calls."""

    name: str
    advantage_fn: str | None
    advantage_args: dict[str, Any] = field(default_factory=dict)
    policy_loss_fn: str = "ppo_clip"
    policy_loss_args: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    needs_old_logprobs: bool = True  # False for offline losses (SFT): skips a forward pass per step

    @classmethod
    def from_config(cls, cfg: AlgorithmConfig) -> AlgorithmSpec:
        preset = get_preset(cfg.algorithm_type)
        return cls(
            name=preset.name,
            advantage_fn=cfg.advantage_fn or preset.advantage_fn,
            advantage_args={**preset.advantage_args, **cfg.advantage_args},
            policy_loss_fn=cfg.policy_loss_fn or preset.policy_loss_fn,
            policy_loss_args={**preset.policy_loss_args, **cfg.policy_loss_args},
            aggregation=cfg.loss_agg_mode or preset.aggregation,
            kl_coef=cfg.kl_loss.coef,
            kl_estimator=cfg.kl_loss.estimator,
            needs_old_logprobs=preset.needs_rollouts,
        )


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
        seed: int = 0,
    ):
        if algorithm.kl_coef > 0 and ref_model is None:
            raise ValueError("algorithm.kl_loss.coef > 0 needs a reference model; pass ref_model")
        self.model = model
        self.cfg = cfg
        self.algorithm = algorithm
        self.pad_token_id = pad_token_id
        self.temperature = temperature if temperature > 0 else 1.0  # greedy rollouts report T=1 log-probs
        self.max_response_length = max_response_length
        self.ref_model = ref_model
        self.device = next(model.parameters()).device
        self.optimizer = build_optimizer(model.parameters(), cfg)
        self.total_steps = total_steps
        self.scheduler = None  # built on the first step, when the number of updates per step is known
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)

    def train_step(self, experiences: Sequence[Experience]) -> dict[str, float]:
        t0 = time.perf_counter()
        self.model.eval()
        batch = collate(experiences, self.pad_token_id, self.cfg.pack_length).to(self.device)
        advantages, metrics = self._advantages(batch)
        minis = self._mini_batches(batch)
        if self.scheduler is None:
            updates = self.total_steps * self.cfg.ppo_epochs * len(minis)
            self.scheduler = build_scheduler(self.optimizer, updates, self.cfg)
        # With one update per batch the policy is unchanged until that update, so the old log-probs are
        # the training forward's own (detached): one forward pass fewer, the same numbers.
        single_update = self.cfg.ppo_epochs == 1 and len(minis) == 1
        old_lp = None
        if self.algorithm.needs_old_logprobs and not single_update:
            old_lp = batched_logprobs(self.model, batch, self.cfg.micro_batch_size, self.temperature)
        elif not self.algorithm.needs_old_logprobs:
            old_lp = torch.zeros_like(batch.rollout_logprobs)
        ref_lp = None
        if self.algorithm.kl_coef > 0:
            ref_lp = batched_logprobs(self.ref_model, batch, self.cfg.micro_batch_size, self.temperature)
        seen_lp = torch.zeros_like(batch.rollout_logprobs)  # log-probs of the first pass, for the mismatch
        sums: dict[str, float] = {}
        updates = 0
        for epoch in range(self.cfg.ppo_epochs):
            for rows in minis if epoch == 0 else self._mini_batches(batch):
                for k, v in self._update(batch, rows, old_lp, ref_lp, advantages, seen_lp).items():
                    sums[k] = sums.get(k, 0.0) + v
                updates += 1
        metrics.update({k: v / updates for k, v in sums.items()})
        if self.algorithm.needs_old_logprobs:
            metrics.update(self._mismatch_metrics(batch, seen_lp if old_lp is None else old_lp))
        self.step += 1
        metrics.update(
            {
                "train/lr": self.scheduler.get_last_lr()[0],
                "train/step_seconds": time.perf_counter() - t0,
                "train/sequences": float(batch.num_seqs),
                "train/action_tokens": float(batch.loss_mask.sum()),
                "train/reward_mean": float(batch.rewards.mean()),
            }
        )
        return metrics

    def _advantages(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if self.algorithm.advantage_fn is None:
            return torch.zeros_like(batch.rollout_logprobs), {}
        fn = ADVANTAGE_FNS.get(self.algorithm.advantage_fn)
        inputs = AdvantageInputs(
            rewards=batch.rewards, group_ids=batch.group_ids, mask=batch.loss_mask, seq_index=batch.seq_index
        )
        adv, metrics = fn(inputs, **self.algorithm.advantage_args)
        return adv.detach(), dict(metrics)

    def _mini_batches(self, batch: TrainBatch) -> list[torch.Tensor]:
        """Row index sets, one per optimizer step; shuffled when there is more than one."""
        n = batch.num_rows
        size = self.cfg.mini_batch_size or batch.num_seqs  # in sequences
        if batch.packed:  # rows hold several sequences: convert with the packing ratio
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
        scale = loss_scale(mask, batch.seq_index[rows], float(self.max_response_length))
        # Dropout stays off for RL (old and new log-probs must come from the same function); SFT trains
        # in train mode.
        self.model.train(not self.algorithm.needs_old_logprobs)
        sums: dict[str, float] = {}
        total_loss = 0.0
        mb = self.cfg.micro_batch_size
        for start in range(0, rows.numel(), mb):
            idx = rows[start : start + mb]
            sub = batch.select_rows(idx)
            lp = token_logprobs(self.model, sub, self.temperature)
            seen_lp[idx] = lp.detach()
            inputs = PolicyLossInputs(
                logprobs=lp,
                old_logprobs=lp.detach() if old_lp is None else old_lp[idx],
                advantages=advantages[idx],
                mask=sub.loss_mask,
                seq_index=sub.seq_index,
            )
            loss, m = actor_loss(
                inputs,
                policy_loss=self.algorithm.policy_loss_fn,
                policy_loss_args=self.algorithm.policy_loss_args,
                aggregation=self.algorithm.aggregation,
                scale=scale,
                kl_estimator=self.algorithm.kl_estimator if self.algorithm.kl_coef > 0 else None,
                kl_coef=self.algorithm.kl_coef,
                ref_logprobs=None if ref_lp is None else ref_lp[idx],
            )
            loss.backward()
            total_loss += float(loss.detach())
            # loss/* entries are already this micro-batch's share of the mini-batch loss: add them up;
            # other metrics are micro-batch means: weight them by the micro-batch's share of tokens.
            weight = float(sub.loss_mask.sum()) / max(1.0, scale.num_tokens)
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if k.startswith("loss/") else weight)
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return {**sums, "train/loss": total_loss, "train/grad_norm": grad_norm}

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    @staticmethod
    def _mismatch_metrics(batch: TrainBatch, old_lp: torch.Tensor) -> dict[str, float]:
        """Rollout-engine vs trainer log-probs on the same tokens (training-inference mismatch)."""
        mask = batch.loss_mask
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

    # --- state for checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }
