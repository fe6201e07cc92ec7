"""Metrics: one JSON line per record in ``{run_dir}/metrics.jsonl`` (always), and a console progress bar.

Each record carries ``stage``, ``step`` (within the stage) and ``global_step`` (across stages), so one
file holds a multi-stage run's whole learning curve.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"

# What the progress bar shows, in order: (metric key suffix, short label)
_BAR_KEYS = (
    ("rollout/reward_mean", "reward"),
    ("rollout/accuracy", "acc"),
    ("train/loss", "loss"),
    ("sft/nll", "nll"),
)


class MetricsWriter:
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        self._t0 = time.time()

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        clean.setdefault("time", round(time.time() - self._t0, 3))
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, float):
        return round(v, 6)
    return v


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no {METRICS_FILE} in {run_dir}: is it a run folder (trivium run writes one)?"
        )
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


class Progress:
    """A tqdm bar per stage showing the key numbers of the latest step (and the latest eval accuracy)."""

    def __init__(self, stage: str, total: int, initial: int = 0, enabled: bool = True):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=stage, dynamic_ncols=True, leave=True)
        self.eval_text = ""

    def update(self, metrics: dict[str, Any]) -> None:
        if self.bar is None:
            return
        self.note_eval(metrics)
        postfix = {label: f"{metrics[key]:.3f}" for key, label in _BAR_KEYS if key in metrics}
        if self.eval_text:
            postfix["eval_acc"] = self.eval_text
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def note_eval(self, metrics: dict[str, Any]) -> None:
        """Remember the latest eval accuracies; they are shown with every later step."""
        evals = [v for k, v in metrics.items() if k.startswith("eval/") and k.endswith("/accuracy")]
        if evals:
            self.eval_text = " ".join(f"{v:.3f}" for v in evals)
            if self.bar is not None:
                self.bar.set_postfix({"eval_acc": self.eval_text})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
