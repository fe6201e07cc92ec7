"""One plot for comparisons over seeds: each variant's runs thin, their mean thick (recipes.py, selection.py)."""

from __future__ import annotations

import statistics
from pathlib import Path


def plot_variants(rows: list[dict], names: list[str], key: str, ylabel: str, title: str, out: Path) -> None:
    """``rows``: one per run, ``row[key]`` naming its variant and ``row["curve"]`` its (step, value) points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for k, name in enumerate(names):
        mine = [r for r in rows if r[key] == name]
        if not mine:
            continue
        colour = f"C{k}"
        for r in mine:
            steps, values = zip(*r["curve"])
            ax.plot(steps, values, color=colour, alpha=0.25, linewidth=1)
        steps = [s for s, _ in mine[0]["curve"]]
        means = [statistics.fmean(dict(r["curve"]).get(s, float("nan")) for r in mine) for s in steps]
        ax.plot(steps, means, color=colour, linewidth=2.2, marker="o", label=f"{name} (mean of {len(mine)})")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
