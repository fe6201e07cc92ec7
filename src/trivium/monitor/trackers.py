"""Experiment trackers: the metrics records of a run sent to tensorboard, wandb, mlflow or a tracker of
your own, next to ``metrics.jsonl`` (which is always written). Listed in ``monitor.backends``.

A tracker is a class, registered in ``TRACKERS`` by name or named ``module:Class`` (one signature, the
``Tracker`` base class): ``Tracker(context)``, then ``log_config(resolved)`` once per new tracker run,
``log(step, scalars)`` per record, ``close(failed)``. The libraries are imported when a tracker opens, never
before: each is an optional extra (``requires`` is the module checked at ``check-config``, ``extra`` the pip
extra that installs it).

Resume: ``TrackerSet`` (``tracker_set.py``) keeps, in the run folder, each tracker's own ``saved`` values (the
wandb run id, the mlflow run id) and the last step it logged per key, so a resumed run continues the same
tracker run and never sends a (key, step) twice.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trivium.registry import Registry, subclass_of


@dataclass
class TrackerContext:
    """What a tracker is opened with. ``monitor``: the run's ``MonitorConfig``; ``saved``: what this tracker
    put in ``saved`` in an earlier process of the run (empty on a new run), to be updated in place."""

    run_dir: Path
    project: str
    name: str  # the run name, with the role of a decoupled run's process appended
    role: str | None
    monitor: Any
    args: dict[str, Any] = field(default_factory=dict)  # monitor.backend_args[name]
    saved: dict[str, Any] = field(default_factory=dict)

    @property
    def resumed(self) -> bool:
        return bool(self.saved)


class Tracker:
    """Base class of every tracker (``monitor.backends``). Subclasses set ``requires``/``extra`` when
    they need a library, and store what a resumed process needs (a run id) in ``context.saved``."""

    requires: ClassVar[str | None] = None  # module that must be importable
    extra: ClassVar[str | None] = None  # pip extra of trivium that installs it
    # True: what ``log`` was given is on disk when it returns; False: the library buffers it until
    # ``close`` (a killed process loses it, and the next one sends it again from the metrics file)
    durable: ClassVar[bool] = True

    def __init__(self, context: TrackerContext):
        self.context = context

    def log_config(self, resolved: dict[str, Any]) -> None:
        """The resolved config ({stage: config}), once, when the tracker run is created."""

    def already_logged(self) -> dict[str, int]:
        """For a tracker that is not ``durable``, when its run is continued: {key: last step} that its own
        store holds, whatever the run folder's record says (a killed process's writes may have landed)."""
        return {}

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Scalars of one record at ``step`` (the run's global step); each (key, step) comes once."""
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        """End of this process (``failed``: it ends by an exception)."""


TRACKERS: Registry[type[Tracker]] = Registry(
    "monitor backend",
    doc="a subclass of trivium.monitor.trackers.Tracker, called Tracker(context)",
    check=subclass_of(Tracker),
)


def flat_params(resolved: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'grpo.trainer.lr': 2e-4, ...}``: nested dicts joined by dots, lists written as text."""
    out: dict[str, Any] = {}
    for key, value in resolved.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


@TRACKERS.register("tensorboard")
class TensorboardTracker(Tracker):
    """Event files (``torch.utils.tensorboard``) in ``monitor.tensorboard.log_dir``; each process of a run
    adds a file; the config is logged as hyperparameters (HPARAMS tab) and as text."""

    requires, extra = "tensorboard", "tensorboard"

    def __init__(self, context: TrackerContext):
        super().__init__(context)
        from torch.utils.tensorboard import SummaryWriter

        base = context.monitor.tensorboard.log_dir or str(context.run_dir / "tensorboard")
        log_dir = Path(base) / context.role if context.role else Path(base)
        self.writer = SummaryWriter(log_dir=str(log_dir))
        context.saved.setdefault("log_dir", str(log_dir))

    def log_config(self, resolved: dict[str, Any]) -> None:
        import yaml
        from torch.utils.tensorboard.summary import hparams

        flat = flat_params(resolved)
        for summary in hparams(flat, {}):
            self.writer.file_writer.add_summary(summary)
        text = "\n".join("    " + line for line in yaml.safe_dump(resolved, sort_keys=False).splitlines())
        self.writer.add_text("config", text)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a live tensorboard sees every step

    def close(self, failed: bool = False) -> None:
        self.writer.close()


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """A W&B run (offline by default, under wandb/ in the run folder); a resumed process continues the run
    with the id it saved. Steps are the run's global steps (W&B's ``step``)."""

    requires, extra = "wandb", "wandb"
    # wandb 0.31's service (a process of its own) writes the offline file when it gets to it: a SIGKILLed
    # run may lose its last records, or not; a resumed one asks the files (``already_logged``)
    durable = False

    def __init__(self, context: TrackerContext):
        super().__init__(context)
        import wandb

        c = context.monitor.wandb
        run_id = context.saved.get("id") or secrets.token_hex(4)  # W&B ids: [a-z0-9]
        self.run = wandb.init(
            mode=c.mode,
            id=run_id,
            resume="allow",
            project=c.project or context.project,
            entity=c.entity or None,
            name=context.name,
            tags=c.tags or None,
            dir=str(context.run_dir),
            reinit="create_new",  # tests and multi-run scripts open several runs in one process
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        context.saved["id"] = run_id

    def log_config(self, resolved: dict[str, Any]) -> None:
        self.run.config.update(resolved, allow_val_change=True)

    def already_logged(self) -> dict[str, int]:
        """The steps in the run's earlier offline files (online: W&B's server holds them; none known)."""
        from trivium.monitor.wandb_files import last_steps

        if self.context.monitor.wandb.mode != "offline":
            return {}
        return last_steps(self.context.run_dir, self.context.saved["id"])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


@TRACKERS.register("mlflow")
class MlflowTracker(Tracker):
    """An MLflow run through ``MlflowClient`` (no global state: several runs may share a process); the
    config's fields are the run's params (dotted names, values cut at 500 characters)."""

    requires, extra = "mlflow", "mlflow"

    def __init__(self, context: TrackerContext):
        super().__init__(context)
        from mlflow.tracking import MlflowClient

        c = context.monitor.mlflow
        uri = c.tracking_uri or f"sqlite:///{(context.run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        if context.saved.get("run_id"):
            self.run_id = context.saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = c.experiment or context.project
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:  # artifacts next to a local database, not in the working directory's mlruns/
                artifacts = (context.run_dir / "mlflow_artifacts").resolve().as_uri()
                local = uri.startswith("sqlite:")
                experiment_id = self.client.create_experiment(
                    name, artifact_location=artifacts if local else None
                )
            run = self.client.create_run(experiment_id, run_name=context.name)
            self.run_id = run.info.run_id
        context.saved.update(run_id=self.run_id, tracking_uri=uri)

    def log_config(self, resolved: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:500]) for k, v in flat_params(resolved).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars.items() if math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
