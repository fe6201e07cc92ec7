"""Metrics to ``metrics.jsonl`` (always), a console progress bar, and learning-curve plots."""

from trivium.monitor.metrics import METRICS_FILE, MetricsWriter, Progress, read_metrics

__all__ = ["METRICS_FILE", "MetricsWriter", "Progress", "read_metrics"]
