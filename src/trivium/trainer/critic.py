"""The PPO critic: a value head on a causal LM's backbone, trained with the clipped value loss.

``values[r, t]`` estimates the return from action token t on, from the hidden state that predicts token t
(position t − 1), so values are target-aligned like log-probs. The critic has its own AdamW; during the
first ``warmup_steps`` only the critic trains (the trainer skips policy updates), so that the first policy
updates see useful advantages.
"""

from __future__ import annotations

import torch
from torch import nn

from trivium.algorithm.aggregation import loss_scale
from trivium.algorithm.losses_value import value_loss
from trivium.config.schema import CriticConfig, TrainerConfig
from trivium.models.attention import compute_dtype
from trivium.trainer.optim import Optimization
from trivium.types import TrainBatch


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_causal_lm(cls, lm: nn.Module) -> ValueModel:
        """A value model whose backbone is a copy of ``lm``'s (the LM head is dropped)."""
        import copy

        backbone = copy.deepcopy(lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model)
        param = next(backbone.parameters())
        model = cls(backbone, lm.config.hidden_size)
        return model.to(device=param.device, dtype=param.dtype)

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=batch.input_ids,
            **batch.attention_inputs(compute_dtype(self.backbone)),
            use_cache=False,
        ).last_hidden_state
        values = self.head(hidden[:, :-1]).squeeze(-1).float()
        return nn.functional.pad(values, (1, 0), value=0.0)


class Critic:
    def __init__(
        self,
        model: ValueModel,
        cfg: CriticConfig,
        trainer_cfg: TrainerConfig,
        total_updates: int,
        max_response_length: int,
        aggregation: str = "token-mean",
    ):
        self.model = model
        self.cfg = cfg
        self.warmup_steps = cfg.warmup_steps
        self.optim = Optimization(model, trainer_cfg, lr=cfg.lr)
        self.optim.plan(total_updates)
        self.max_response_length = max_response_length
        self.aggregation = aggregation
        self.precision = None  # the trainer's (set_precision): fp32 until then

    def set_precision(self, precision) -> None:
        """Run the value model's passes in the trainer's ``Precision`` (autocast, fp16 loss scaling); its
        weights and AdamW state stay float32 and values are upcast to float32 (``ValueModel.forward``)."""
        self.precision = precision
        self.optim.set_precision(precision)
        precision.prepare_attention(self.model)

    def _autocast(self):
        import contextlib

        return contextlib.nullcontext() if self.precision is None else self.precision.autocast()

    @torch.no_grad()
    def values(self, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
        self.model.eval()
        with self._autocast():
            parts = [
                self.model(batch.select_rows(torch.arange(i, min(i + micro_batch_size, batch.num_rows))))
                for i in range(0, batch.num_rows, micro_batch_size)
            ]
        return torch.cat(parts) * batch.loss_mask

    def update(
        self,
        batch: TrainBatch,
        rows: torch.Tensor,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        micro_batch_size: int,
    ) -> dict[str, float]:
        mask = batch.loss_mask[rows]
        scale = loss_scale(mask, batch.seq_index[rows], float(self.max_response_length))
        self.model.train()
        sums: dict[str, float] = {}
        for start in range(0, rows.numel(), micro_batch_size):
            idx = rows[start : start + micro_batch_size]
            sub = batch.select_rows(idx)
            with self._autocast():
                predicted = self.model(sub)
            loss, metrics = value_loss(
                predicted,
                old_values[idx],
                returns[idx],
                sub.loss_mask,
                sub.seq_index,
                clip=self.cfg.value_clip,
                aggregation=self.aggregation,
                scale=scale,
            )
            self.optim.backward(loss)
            # the losses are this micro-batch's share of the mini-batch's already: added up; the other
            # metrics are micro-batch means: weighted by the micro-batch's share of the tokens
            weight = float(sub.loss_mask.sum()) / max(1.0, scale.num_tokens)
            for k, v in {"value/loss": float(loss.detach()), **metrics}.items():
                share = k in ("value/loss", "loss/value")
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if share else weight)
        sums["value/grad_norm"] = self.optim.step()
        self.model.eval()
        return sums

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), **self.optim.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state)
