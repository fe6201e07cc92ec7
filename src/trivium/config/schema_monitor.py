"""The ``monitor`` section: metrics files, the progress display, the stall doctor, and the experiment
trackers the metrics are sent to (``monitor/trackers.py``, docs/observability.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from trivium.config.schema_base import SECONDS_MAX, STEPS_MAX, StrictModel


class TensorboardConfig(StrictModel):
    """Backend ``tensorboard``: event files that ``tensorboard --logdir`` serves."""

    log_dir: str = ""
    """Folder of the event files; empty = tensorboard/ in the run folder (tensorboard/{role} for the
    processes of a decoupled run). Relative paths are relative to the working directory."""


class WandbConfig(StrictModel):
    """Backend ``wandb``: a Weights & Biases run, offline by default (``wandb sync`` uploads it later)."""

    mode: Literal["offline", "online"] = "offline"
    """offline: write the run under wandb/ in the run folder only; online: stream it to the W&B server
    (needs `wandb login` or WANDB_API_KEY)."""
    project: str = ""
    """W&B project; empty = the config's project."""
    entity: str = ""
    """W&B entity (user or team); empty = your default entity."""
    tags: list[str] = Field(default_factory=list)
    """Tags of the W&B run."""


class MlflowConfig(StrictModel):
    """Backend ``mlflow``: an MLflow run, through ``MlflowClient``."""

    tracking_uri: str = ""
    """MLflow tracking URI (sqlite:///path/mlflow.db, http://host:5000, ...); empty = a SQLite file
    mlflow.db in the run folder (browse it with `mlflow ui --backend-store-uri sqlite:///RUN/mlflow.db`)."""
    experiment: str = ""
    """MLflow experiment; empty = the config's project."""


class TrajectoriesConfig(StrictModel):
    """Samples recorded token by token for Studio's trajectory viewer (monitor/trajectories.py)."""

    every: int = Field(10, ge=0, le=STEPS_MAX)
    """Record every this many train steps of RL stages (0 = never), into trajectories.jsonl in the run folder."""
    per_step: int = Field(8, ge=1, le=1024)
    """Experiences recorded per recorded step, spread over the step's groups."""


class MonitorConfig(StrictModel):
    trajectories: TrajectoriesConfig = Field(default_factory=TrajectoriesConfig)
    """Per-token records of sampled experiences: log-prob, trainer log-prob, entropy, advantage, mask."""
    progress_bar: bool = True
    """Show a console progress bar with reward, accuracy and loss."""
    phase_memory: bool = False
    """Log rss/<phase>: the process's peak resident memory (MB) during each phase of a step (rollout,
    train and its parts, sync, eval), next to time/<phase>. Linux only; it resets the kernel's high-water
    mark of the process at each phase (docs/performance.md), hence off by default. Not in Ray actors. Run-level."""
    stall_timeout_s: float = Field(600.0, ge=0, le=SECONDS_MAX)
    """No step finished for this long: write every thread's stack to stall_*.txt in the run folder and the
    log, saying what each part waits on (launch/doctor.py); the run goes on. Again after as long. 0 = off."""
    backends: list[str] = Field(default_factory=lambda: ["jsonl"], max_length=16)
    """Where metrics go: jsonl (metrics.jsonl in the run folder, always written, listed or not),
    tensorboard, wandb, mlflow, or your own tracker class as 'module:Class' (a subclass of
    trivium.monitor.trackers.Tracker). Each library is an optional extra: pip install 'trivium[wandb]'.
    Run-level: set at the top level (a stage cannot change it). A resumed run continues the same tracker run."""
    tensorboard: TensorboardConfig = Field(default_factory=TensorboardConfig)
    """Settings of the tensorboard backend."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Settings of the wandb backend."""
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    """Settings of the mlflow backend."""
    backend_args: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Arguments of your own trackers, by the name listed in backends, e.g. {'my_mod:MyTracker': {url:
    ...}}; the tracker reads them as ``context.args``."""
