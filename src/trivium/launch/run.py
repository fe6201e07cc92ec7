"""``trivium run``: execute a validated run, stage by stage, in this process.

Each stage starts from the previous stage's final weights; a log line tells the whole run's progress (stage k
of n, time left: ``monitor.metrics.RunProgress``). Every stage that trains runs the one train
loop (``loop.py``) with its mode's batch source (``stages.py``); mode explore runs the explore process of
a decoupled run (``decoupled.py``), mode serve the endpoint (``trivium.serve``), mode bench evaluates
checkpoints (``bench.py``). A run folder that already holds a run is continued from its newest checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import sys
from pathlib import Path

import torch
import yaml

from trivium.launch import build, stages
from trivium.launch.doctor import stall_doctor
from trivium.launch.loop import RunState
from trivium.launch.placement import placement_of
from trivium.launch.resume import find_resume_point
from trivium.launch.runtime import apply_threads, keep_freed_memory
from trivium.launch.stopping import RunStopped
from trivium.monitor.metrics import METRICS_FILE, MetricsWriter, RunProgress, metrics_path
from trivium.monitor.phases import PEAK_RSS
from trivium.monitor.status import recorded
from trivium.monitor.tracker_set import TrackerSet
from trivium.validation.load import RunConfig, Stage

log = logging.getLogger(__name__)


class RunFolderExists(RuntimeError):
    pass


def run_dir_of(run: RunConfig) -> Path:
    c = run.config
    return Path(c.checkpoint_root) / c.project / c.name


def run(run_cfg: RunConfig, overwrite: bool = False, resume: bool = True) -> Path:
    """Run every stage; on a run folder that already holds a run, continue it from its newest checkpoint."""
    run_dir = run_dir_of(run_cfg)
    # An explore (or serve) and a train process share one run folder: whichever starts second joins it.
    shared = all(
        s.config.buffer.storage is not None and s.config.mode in ("explore", "train", "serve")
        for s in run_cfg.stages
    )
    names = [s.name for s in run_cfg.stages]
    point = None
    if (run_dir / METRICS_FILE).exists() and not shared:
        if overwrite:
            shutil.rmtree(run_dir)
        elif not resume:
            raise RunFolderExists(
                f"run folder {run_dir} already holds a run and --no-resume was given: continue it (drop "
                f"--no-resume), replace it (--overwrite), or start another (--set name=<new name>)"
            )
        else:
            point = find_resume_point(run_dir, names)
            if point is None:
                log.warning("run folder %s has no complete checkpoint to resume from: starting over", run_dir)
                shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {s.name: s.config.model_dump(mode="json") for s in run_cfg.stages}
    modes = "-".join(sorted({s.config.mode for s in run_cfg.stages}))
    name = "resolved_config.yaml" if not shared else f"resolved_config.{modes}.yaml"
    (run_dir / name).write_text(yaml.safe_dump(resolved, sort_keys=False))
    _quiet_libraries()
    apply_threads(run_cfg.config.runtime.num_threads)
    keep_freed_memory(run_cfg.config.runtime.keep_freed_memory)
    if not PEAK_RSS.enable(run_cfg.config.monitor.phase_memory) and run_cfg.config.monitor.phase_memory:
        log.warning(
            "monitor.phase_memory: this system has no writable /proc/self/clear_refs; rss/<phase> is not logged"
        )
    _seed_everything(run_cfg.config.seed)
    if not torch.cuda.is_available():
        torch.set_flush_denormal(True)  # denormals slowed CPU training ~3x as weights shrank

    # every stage's data is read and checked before any model is loaded; it gives each stage's step count
    progress = RunProgress([(s.name, _check_data(s)) for s in run_cfg.stages])
    # the stage the point is in resumes from it (RunState.take_resume)
    state = RunState(resume=point, config_dir=Path(run_cfg.source).resolve().parent)
    if point is not None:
        log.info("run folder %s holds a run: continuing it from its newest checkpoint", run_dir)
    # the processes of a decoupled run each write a metrics file of their own
    role = modes if shared else None
    trackers = TrackerSet(  # monitor.backends: run-level, a resumed run continues the same tracker runs
        run_cfg.config.monitor,
        run_dir,
        project=run_cfg.config.project,
        name=run_cfg.config.name,
        role=role,
        resolved=resolved,
        replay=metrics_path(run_dir, role),
    )
    writer = MetricsWriter(run_dir, role=role, progress=progress, trackers=trackers)
    # status.json: running, then finished / stopped / failed (trivium studio and scripts read it)
    with (
        run_log(run_dir, role),
        recorded(run_dir, writer.role, (RunStopped, KeyboardInterrupt), config=run_cfg.source, stages=names),
    ):
        _run_stages(run_cfg, run_dir, writer, state, point, progress)
        log.info("run finished: %s", run_dir)
    return run_dir


@contextlib.contextmanager
def run_log(run_dir: Path, role: str | None):
    """The run's log lines also go to ``run.log`` in its folder (``run.{role}.log`` for each process of a
    decoupled run), appended on resume: what Studio shows for a run started from the command line."""
    handler = logging.FileHandler(run_dir / (f"run.{role}.log" if role else "run.log"), encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logger = logging.getLogger("trivium")  # every module's logger is below it
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # the file gets the run's progress even where the console shows less
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


def _run_stages(run_cfg: RunConfig, run_dir: Path, writer, state: RunState, point, progress) -> None:
    """The stages from the resume point on, on the Ray cluster when ``cluster.backend`` is ray; the metrics
    writer (and its trackers) and the cluster are closed at the end, failed or not."""
    place = placement_of(run_cfg.config)
    try:
        place.open(run_cfg, state.config_dir)
        for i, stage in enumerate(run_cfg.stages):
            if point is not None and i < point.stage_index:
                continue  # finished before the checkpoint we resume from
            progress.start_stage(i)
            # reports a stall (no step record for monitor.stall_timeout_s) with every thread's stack
            doctor = stall_doctor(stage.config, run_dir, writer.path, role=writer.role)
            with doctor or contextlib.nullcontext():
                run_stage(stage, run_dir, writer, state)
            following = run_cfg.stages[i + 1].config if i + 1 < len(run_cfg.stages) else None
            place.end_stage(stage.config, following)
    finally:
        writer.close()
        place.close()


def _check_data(stage: Stage) -> int | None:
    """Load every task set and dataset of ``stage`` once: a bad row fails now, not after earlier stages.
    Returns the stage's planned steps, for the run's progress line (None: bench and serve run no steps)."""
    from trivium.buffer.offline import PreferenceReader, SftReader

    cfg = stage.config
    rows = None
    if cfg.mode in ("both", "explore") or (cfg.mode == "train" and cfg.buffer.storage is not None):
        if cfg.buffer.taskset is not None:  # a serve-fed train process has none: total_steps is set
            rows = len(build.train_tasks(cfg))
    elif cfg.mode == "train" and cfg.buffer.sft_dataset is not None:
        rows = len(SftReader(cfg.buffer.sft_dataset, tokenizer=None, seed=cfg.seed))
    elif cfg.mode == "train" and cfg.buffer.preference_dataset is not None:
        rows = len(PreferenceReader(cfg.buffer.preference_dataset, tokenizer=None, seed=cfg.seed))
    for ts in cfg.buffer.eval_tasksets:
        build.task_reader(ts, cfg.seed, is_eval=True)
    if cfg.mode in ("bench", "serve"):
        return None
    return cfg.buffer.total_steps or (build.total_steps(cfg, rows) if rows is not None else None)


def run_stage(stage: Stage, run_dir: Path, writer: MetricsWriter, state: RunState) -> None:
    cfg = stage.config
    if state.model is None and state.resume is None and cfg.mode != "bench":
        path = build.ensure_model(cfg, run_dir)
        state.model, state.tokenizer = build.load_policy(path, cfg)
    if cfg.mode == "bench":
        from trivium.launch.bench import bench_loop

        bench_loop(stage, run_dir, writer, state)
    elif cfg.mode == "explore":
        from trivium.launch.decoupled import explore_loop

        explore_loop(stage, run_dir, writer, state)
    elif cfg.mode == "serve":
        from trivium.launch.serve_mode import serve

        serve(cfg, run_dir, state.model, state.tokenizer)
    elif cfg.mode == "train" and cfg.buffer.storage is not None:
        stages.storage_stage(stage, run_dir, writer, state)
    elif cfg.mode == "both":
        stages.online_stage(stage, run_dir, writer, state)
    else:
        stages.dataset_stage(stage, run_dir, writer, state)


def _quiet_libraries() -> None:
    """Keep the console and the cores for Trivium: no HF progress bars, no tokenizer thread pool."""
    # The Rust tokenizer's thread pool competes with torch for the cores while workflows tokenise in
    # threads (measured: rollout 25% slower on 2 cores); the explorer's threads give enough parallelism.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # `datasets` (0.7 s to import) is needed only by runs that read a Hub dataset or a datasets format
    # (buffer/sources.py imports it then): its switch is read from the environment when it is imported.
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    else:
        os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    import transformers

    transformers.utils.logging.disable_progress_bar()
    # math-verify warns once per process that we disabled its signal-based timeouts (needed in threads)
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
