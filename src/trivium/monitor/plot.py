"""``trivium plot RUN_DIR``: reward, eval accuracy and loss against the global step, one PNG."""

from __future__ import annotations

from pathlib import Path

from trivium.monitor.metrics import read_metrics


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    out = Path(out) if out else run_dir / "curves.png"

    stages = [name for _, name in _stage_starts(records)]
    # Eval "accuracy": the accuracy metric of each eval set, or its success rate (environments report it)
    eval_keys = sorted(
        {k for r in records for k in r if k.startswith("eval/") and k.endswith(("/accuracy", "/success"))}
    )
    panels = [  # (title, [(label, key, stage)]): losses per stage, since SFT and RL losses differ in scale
        ("train reward", [("rollout/reward_mean", "rollout/reward_mean", None)]),
        ("eval accuracy", [(k, k, None) for k in eval_keys]),
        ("loss", [(f"{s}: train/loss", "train/loss", s) for s in stages]),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (title, lines) in zip(axes, panels):
        xs_all = []
        for label, key, stage in lines:
            xs, ys = curve(records, key, stage)
            if xs:
                ax.plot(xs, ys, marker="o" if title == "eval accuracy" else None, markersize=3, label=label)
                xs_all += xs
        for x, name in _stage_starts(records):  # stage boundaries inside this panel's data only
            if xs_all and min(xs_all) <= x <= max(xs_all):
                ax.axvline(x, color="grey", linestyle=":", linewidth=1)
                ax.text(x, 1.0, f" {name}", transform=ax.get_xaxis_transform(), fontsize=8, va="top")
        ax.set_title(title)
        ax.set_xlabel("global step")
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{run_dir.name}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def curve(records: list[dict], key: str, stage: str | None = None) -> tuple[list, list]:
    """``key`` against the global step, in step order. A step recorded twice (a run folder written before
    resumed processes dropped their records after the checkpoint) keeps its last record: no line goes back."""
    pts = {
        r["global_step"]: r[key]
        for r in records
        if key in r and isinstance(r[key], (int, float)) and (stage is None or r.get("stage") == stage)
    }
    xs = sorted(pts)
    return xs, [pts[x] for x in xs]


def _stage_starts(records: list[dict]) -> list[tuple[int, str]]:
    seen, out = set(), []
    for r in records:
        stage = r.get("stage")
        if stage is not None and stage not in seen:
            seen.add(stage)
            out.append((r.get("global_step", 0), stage))
    return out
