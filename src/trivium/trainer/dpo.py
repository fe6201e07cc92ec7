"""DPO: preference pairs in, one optimizer step out (docs/algorithms.md §18).

The reference model's summed log-probs are computed once per batch (no gradient), then the policy is
trained over micro-batches of whole pairs; each micro-batch adds its pairs' share of the batch mean, so
the loss does not depend on the micro-batch size. Chosen and rejected are paired by explicit indices.
A pair is two rows, or one with ``trainer.share_prompts`` (``trainer/layout.py``: the prompt once, then the
chosen and the rejected response, each attending to the prompt and to itself; ``auto`` takes it for a step
whose pair rows hold at most ``SHARE_AT`` of two rows' tokens, long prompts against short responses).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from trivium.algorithm.aggregation import sequence_sums
from trivium.algorithm.losses_preference import dpo_loss
from trivium.config.schema import DpoConfig, TrainerConfig
from trivium.trainer.compiling import compile_decoder_layers
from trivium.trainer.guard import NumericGuard
from trivium.trainer.layout import plan_shared_rows, why_not_shared
from trivium.trainer.logprobs import batched_logprobs, token_logprobs
from trivium.trainer.model_io import export_weights, save_model
from trivium.trainer.optim import Optimization
from trivium.trainer.parallel import Parallel, micro_rows
from trivium.trainer.precision import choose_precision, model_probe
from trivium.trainer.recompute import recompute_decoder_layers
from trivium.types import PreferencePair, collate_pairs


class DpoTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        ref_model: torch.nn.Module,
        cfg: TrainerConfig,
        dpo: DpoConfig,
        *,
        pad_token_id: int,
        total_steps: int,
    ):
        self.model, self.ref_model, self.cfg, self.dpo = model, ref_model, cfg, dpo
        self.pad_token_id = pad_token_id
        self.device = next(model.parameters()).device
        self.parallel = Parallel(self.device)  # DPO trains on one rank (trainer.strategy single)
        self.precision = choose_precision(
            cfg.precision,
            self.device,
            next(model.parameters()).dtype,
            model_probe(model, self.device),
            head_grad_precision=cfg.head_grad_precision,
        )
        self.precision.prepare_attention(model, ref_model)
        self._unshared = why_not_shared(None, False, (model, ref_model))
        if cfg.share_prompts is True and self._unshared is not None:
            raise ValueError(
                f"trainer.share_prompts: true, but {self._unshared}: set trainer.share_prompts to auto or false"
            )
        if cfg.gradient_checkpointing:
            recompute_decoder_layers(model)
        if cfg.compile:
            compile_decoder_layers(model, self.precision.name, self.device.type)
        self.optim = Optimization(model, cfg, precision=self.precision)
        self.optim.plan(total_steps)
        # an update with a non-finite or absurd gradient norm is skipped (optim.py); max_bad_steps in a row
        # stop the run (guard.py), as in the RL and SFT trainer
        self.guard = NumericGuard(cfg.max_abs_reward, cfg.max_bad_steps)
        self.step = 0

    def train_step(self, pairs: Sequence[PreferencePair]) -> dict[str, float]:
        t0 = time.perf_counter()
        shared, layout = self._layout(pairs)
        batch, chosen, rejected = collate_pairs(pairs, self.pad_token_id, shared)
        batch = batch.to(self.device)
        rows_a_pair = 2 if shared is None else 1
        micro = micro_rows(  # micro_batch_size counts sequences: as many pairs a pass in either layout
            self.cfg.micro_batch_size if shared is None else max(1, self.cfg.micro_batch_size // 2),
            self.cfg.max_tokens_per_micro_batch,
            batch.num_rows,
            batch.input_ids.shape[1],
        )
        with self.precision.autocast():
            ref_lp = batched_logprobs(self.ref_model, batch, micro)
        ref_sums = sequence_sums(ref_lp, batch.loss_mask, batch.seq_index, batch.num_seqs)
        self.model.train()
        skipped_before = self.optim.skipped
        n_pairs = len(pairs)
        per_micro = max(1, micro // rows_a_pair)  # pairs per micro-batch
        sums: dict[str, float] = {}
        for start in range(0, n_pairs, per_micro):
            k = torch.arange(start, min(start + per_micro, n_pairs))
            rows = k if shared is not None else torch.stack([chosen[k], rejected[k]], dim=1).flatten()
            sub = batch.select_rows(rows)  # sequences in pair order: c0 r0 c1 r1 ...
            with self.precision.autocast():
                lp = token_logprobs(self.model, sub)
            seq = sequence_sums(lp, sub.loss_mask, sub.seq_index, sub.num_seqs)
            # select_rows renumbers sequences in ascending original order, which is c0 r0 c1 r1 ... here
            loss, metrics = dpo_loss(
                seq[0::2],
                seq[1::2],
                ref_sums[chosen[k]],
                ref_sums[rejected[k]],
                beta=self.dpo.beta,
                label_smoothing=self.dpo.label_smoothing,
            )
            share = k.numel() / n_pairs
            self.optim.backward(loss * share)
            for key, v in {"dpo/loss": float(loss.detach()), **metrics}.items():
                sums[key] = sums.get(key, 0.0) + float(v) * share
        grad_norm = self.optim.step()
        self.model.eval()
        self.step += 1
        skipped = self.optim.skipped - skipped_before
        self.guard.step_done(
            self.step, f"{skipped} update(s) with a non-finite or absurd gradient norm" if skipped else None
        )
        return {
            **sums,
            "train/loss": sums["dpo/loss"],
            "train/grad_norm": grad_norm,
            "train/skipped_updates": float(skipped),
            "train/lr": self.optim.lr,
            "train/pairs": float(n_pairs),
            "train/step_seconds": time.perf_counter() - t0,
            **layout,
        }

    def _layout(self, pairs: Sequence[PreferencePair]) -> tuple[list[list[int]] | None, dict[str, float]]:
        """A pair a row (``[2k, 2k + 1]``: its chosen and rejected sequences), or None for a row a sequence."""
        if self._unshared is not None:
            return None, {}
        sequences = [e for pair in pairs for e in pair.as_experiences()]
        one_a_pair = [[2 * k, 2 * k + 1] for k in range(len(pairs))]
        return plan_shared_rows(sequences, self.cfg.share_prompts, 0, rows=one_a_pair)

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy's weights (see ``model_io.export_weights``)."""
        return export_weights(self.model, self.parallel, dtype)

    def save_model(self, folder: Path) -> None:
        save_model(self.model, self.parallel, self.optim.optimizer, folder)

    def state_dict(self) -> dict:
        return {"step": self.step, **self.optim.state_dict()}

    def load_state_dict(self, state: dict, folder: Path | None = None) -> None:
        self.step = state["step"]
        self.optim.load_state_dict(state)
