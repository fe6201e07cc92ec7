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

    def series(key: str):
        pts = [(r["global_step"], r[key]) for r in records if key in r and isinstance(r[key], (int, float))]
        return [p[0] for p in pts], [p[1] for p in pts]

    eval_keys = sorted({k for r in records for k in r if k.startswith("eval/") and k.endswith("/accuracy")})
    panels = [
        ("train reward", ["rollout/reward_mean"]),
        ("eval accuracy", eval_keys),
        ("loss", ["train/loss"]),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    boundaries = _stage_starts(records)
    for ax, (title, keys) in zip(axes, panels):
        for key in keys:
            xs, ys = series(key)
            if xs:
                ax.plot(xs, ys, marker="o" if title == "eval accuracy" else None, markersize=3, label=key)
        for x, name in boundaries:
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


def _stage_starts(records: list[dict]) -> list[tuple[int, str]]:
    seen, out = set(), []
    for r in records:
        stage = r.get("stage")
        if stage is not None and stage not in seen:
            seen.add(stage)
            out.append((r.get("global_step", 0), stage))
    return out
