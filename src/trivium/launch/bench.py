"""Mode ``bench``: evaluate the base model and training checkpoints on the eval task sets.

Each model is sampled ``explorer.eval.repeat_times`` (k) times per task at ``explorer.eval.temperature``,
and scored with mean@k (mean accuracy of all samples), best@k (a task counts when some sample is right)
and worst@k (when every sample is right). Results go to ``metrics.jsonl`` (one record per model, stage
``bench``) and to a Markdown table ``bench.md`` in the run folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def find_checkpoints(folder: Path, which: str) -> list[Path]:
    """``model`` folders of ``step_N`` checkpoints under ``folder`` (any depth), oldest first: by the run's
    global step where the checkpoint's ``meta.json`` has it (a later stage's ``grpo/step_100`` comes after
    ``sft/step_800``), else by N. Not by file time: a copied or restored folder has new times."""
    if which == "none" or not folder.exists():
        return []
    found = sorted(
        (p for p in folder.rglob("step_*") if (p / "model").is_dir() and p.name[5:].isdigit()),
        key=lambda p: (_global_step(p), str(p)),
    )
    models = [p / "model" for p in found]
    return models[-1:] if which == "latest" else models


def _global_step(checkpoint: Path) -> int:
    from trivium.trainer.checkpoint import META_FILE

    try:
        return int(json.loads((checkpoint / META_FILE).read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return int(checkpoint.name[5:])


def bench_models(cfg, run_dir: Path) -> list[tuple[str, str]]:
    """``(label, path)`` of the models to evaluate: the base model, then the checkpoints."""
    b = cfg.bench
    folder = Path(b.checkpoint_dir) if b.checkpoint_dir else run_dir / "checkpoints"
    base = cfg.model.path or (str(run_dir / "base_model") if cfg.model.tiny is not None else "")
    models = [("base", base)] if b.include_base and base and Path(base).exists() else []
    for path in find_checkpoints(folder, b.checkpoints):
        models.append(
            (str(path.parent.relative_to(folder)) if path.is_relative_to(folder) else str(path), str(path))
        )
    if not models:
        raise ValueError(
            f"bench found nothing to evaluate: no model.path and no step_N/model checkpoints under {folder}; "
            "set bench.checkpoint_dir to a run's checkpoints folder"
        )
    return models


def bench_loop(stage, run_dir: Path, writer, state) -> None:
    from trivium.launch import build
    from trivium.launch.placement import start_explorer

    cfg = stage.config
    k = cfg.explorer.eval.repeat_times
    rows = []
    trained = (
        state.model,
        state.tokenizer,
    )  # a later stage continues from the trained weights, not the last benched
    for i, (label, path) in enumerate(bench_models(cfg, run_dir)):
        state.model, state.tokenizer = build.load_policy(path, cfg)
        metrics = start_explorer(cfg, state).evaluate()
        record = {"stage": stage.name, "step": i, "global_step": state.global_step, "model": label, **metrics}
        writer.write(record)
        rows.append(record)
        log.info(
            "bench %s: %s",
            label,
            {key: round(v, 3) for key, v in metrics.items() if key.endswith("accuracy")},
        )
    state.model, state.tokenizer = trained
    names = [ts.name or Path(ts.path).stem for ts in cfg.buffer.eval_tasksets]
    stats = [f"mean@{k}", f"best@{k}", f"worst@{k}"] if k > 1 else ["accuracy"]
    header = "| model | " + " | ".join(f"{n} {s}" for n in names for s in stats) + " |"
    lines = [header, "|" + "---|" * (1 + len(names) * len(stats))]
    for r in rows:
        cells = [f"{r.get(f'eval/{n}/{s}', float('nan')):.3f}" for n in names for s in stats]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    (run_dir / "bench.md").write_text(table)
    (run_dir / "bench.json").write_text(json.dumps(rows, indent=1))
    print(table)


def bench_overrides(run_cfg, checkpoints: str | None = None) -> list[str]:
    """``trivium bench CONFIG``: the ``--set`` overrides that turn CONFIG into one mode-bench stage over
    CONFIG's own run: its checkpoints (``bench.checkpoint_dir``) and its starting model (the tiny model the
    run created, when ``model.path`` is empty), written to a run folder of its own, ``{name}-bench``, so the
    training run's folder is left as it is. The top level's explorer and eval task sets are used."""
    c = run_cfg.config
    run_dir = Path(c.checkpoint_root) / c.project / c.name
    out = [
        "stages=[]",
        "mode=bench",
        f"name={c.name}-bench",
        f"bench.checkpoint_dir={run_dir / 'checkpoints'}",
    ]
    if not c.model.path and c.model.tiny is not None:
        out.append(f"model.path={run_dir / 'base_model'}")
    if checkpoints is not None:
        out.append(f"bench.checkpoints={checkpoints}")
    return out
