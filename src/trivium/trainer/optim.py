"""AdamW (fused where torch has the kernel) and the learning-rate schedule (linear warm-up, then constant,
cosine or linear decay)."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch

from trivium.config.schema import TrainerConfig
from trivium.monitor.phases import PEAK_RSS

if TYPE_CHECKING:
    from trivium.trainer.precision import Precision


def adamw_implementation(params: list[torch.Tensor], asked: str) -> str:
    """``trainer.optimizer_impl`` resolved for these parameters: ``auto`` is fused where torch has the fused
    kernel for every parameter's device (and the parameters are floating point), else for_loop."""
    if asked != "auto":
        return asked
    try:  # torch's own list (a private helper: a torch without it gets the devices that have had the kernel)
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        supported = set(_get_fused_kernels_supported_devices())
    except ImportError:
        supported = {"cpu", "cuda"}
    fusable = all(p.device.type in supported and torch.is_floating_point(p) for p in params)
    return "fused" if params and fusable else "for_loop"


def build_optimizer(params, cfg: TrainerConfig) -> torch.optim.Optimizer:
    trainable = [p for p in params if p.requires_grad]
    if cfg.optimizer_state_dtype == "bfloat16":
        from trivium.trainer.adamw_bf16 import Bf16StateAdamW

        return Bf16StateAdamW(trainable, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    impl = adamw_implementation(trainable, cfg.optimizer_impl)
    return torch.optim.AdamW(
        trainable,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=1e-8,
        weight_decay=cfg.weight_decay,
        foreach=impl == "foreach",
        fused=impl == "fused" or None,
    )


def lr_factor(step: int, total: int, cfg: TrainerConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based) of ``total``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_scheduler == "constant":
        return 1.0
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    if cfg.lr_scheduler == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return floor + (1 - floor) * (1 - progress)


def build_scheduler(optimizer: torch.optim.Optimizer, total: int, cfg: TrainerConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, cfg))


class Optimization:
    """One model's optimizer side: AdamW, the schedule (built once the number of updates is known), clipping."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        lr: float | None = None,
        precision: Precision | None = None,
    ):
        """``precision``: the passes' mixed precision (``precision.py``), None for fp32; losses go through
        ``backward``, which applies its fp16 loss scaling and its backward context."""
        self.model = model
        self.cfg = cfg if lr is None else cfg.model_copy(update={"lr": lr})
        self.optimizer = build_optimizer(model.parameters(), self.cfg)
        self.scaler: torch.amp.GradScaler | None = None
        self.backward_context = contextlib.nullcontext
        self.set_precision(precision)
        self.overflows = 0  # fp16 updates the loss scaler skipped (an overflow lowers the scale)
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.planned_updates = 0
        self.skipped = 0  # updates not made: a non-finite or absurd gradient norm

    def plan(self, total_updates: int) -> None:
        if self.scheduler is None:
            self.planned_updates = max(1, total_updates)
            self.scheduler = build_scheduler(self.optimizer, self.planned_updates, self.cfg)

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0] if self.scheduler is not None else self.cfg.lr

    def set_precision(self, precision: Precision | None) -> None:
        if precision is not None:
            self.scaler = precision.grad_scaler()
            self.backward_context = precision.backward_context

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the loss scaler when there is one, in the precision's backward
        context (bf16's matrix-product emulation on CPUs without bf16 instructions)."""
        with self.backward_context():
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self) -> float:
        """Clip, step, advance the schedule, zero the gradients; returns the gradient norm before clipping.

        A norm that is non-finite or above ``trainer.skip_grad_norm`` makes no update (the optimizer and
        the schedule stay where they were, ``skipped`` counts it): see ``guard.py``. With fp16 loss
        scaling the gradients are unscaled first; an overflow there is the scaler's business (it lowers
        its scale and skips the update, ``overflows`` counts it), not a bad step."""
        if self.scheduler is None:
            raise RuntimeError("Optimization.plan(total_updates) must be called before the first step")
        params = [p for p in self.model.parameters() if p.grad is not None]
        scaled = self.scaler is not None and bool(params)
        norm = 0.0
        if scaled:
            self.scaler.unscale_(self.optimizer)
        if params:
            max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        good = math.isfinite(norm) and norm <= self.cfg.skip_grad_norm
        if scaled:
            if good:
                self.scaler.step(self.optimizer)
                self.scheduler.step()
            elif math.isfinite(norm):
                self.skipped += 1
            else:
                self.overflows += 1  # the scaler saw the inf/nan: it lowers its scale, no update
            self.scaler.update()
        elif good:
            self.optimizer.step()
            self.scheduler.step()
        else:
            self.skipped += 1
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def footprint(self) -> dict[str, float]:
        """Trainable parameters (all ranks together), this rank's optimizer-state megabytes, and this
        process's peak resident memory."""
        from torch.distributed.tensor import DTensor

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if isinstance(t, DTensor) else t

        state = (local(v) for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v))
        params = (p for group in self.optimizer.param_groups for p in group["params"])
        return {
            "train/trainable_params": float(sum(p.numel() for p in params)),
            "train/optimizer_mb": sum(t.numel() * t.element_size() for t in state) / 2**20,
            "train/peak_rss_mb": PEAK_RSS.process_peak(),  # this process, whole run
        }

    def state_dict(self, include_optimizer: bool = True) -> dict:
        """``include_optimizer=False``: leave the optimizer's state out (it is saved in shards elsewhere)."""
        state = {
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "planned_updates": self.planned_updates,
        }
        if include_optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        if self.scaler is not None:
            state["grad_scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict, load_optimizer=None) -> None:
        """``load_optimizer(optimizer)``: loads the optimizer's state from where it was saved instead of
        ``state["optimizer"]`` (multi-rank checkpoints)."""
        # The schedule first: building it sets every group's lr to the step-0 value, which the optimizer's
        # saved state (with the lr it had when saved) must then overwrite.
        if state.get("scheduler") is not None:
            self.plan(state["planned_updates"])
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        if load_optimizer is not None:
            load_optimizer(self.optimizer)
        elif "optimizer" not in state:
            raise ValueError(
                "the checkpoint keeps its optimizer state in its dcp/ shards (written by trainer.strategy ddp "
                "or fsdp2), which strategy single cannot read: resume with the strategy that wrote it"
            )
        else:
            self.optimizer.load_state_dict(state["optimizer"])
