"""The ``trivium`` command line: run | check-config | doctor | debug | bench | example | make-tiny | plot | convert |
check-template | studio.

Heavy imports (torch, transformers) happen inside the commands, so ``trivium --help`` is instant. Every
option has a help text (tests/test_cli_basics.py checks it).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path


def entry() -> None:
    """The ``trivium`` command (its console script and ``python -m trivium.cli``): ``main``, then the exit.

    Before exiting it freezes the garbage collector (``gc.freeze``): the interpreter's teardown then does
    not scan the objects alive at the end, which after a ``trivium run`` (torch, transformers and a model
    loaded) took 1.2-1.5 s of every command's exit, against 0.2 s frozen (measured on a 2-core EPYC). What
    an exit must do still happens: atexit handlers (logging's flush, weakref finalizers such as temporary
    folders') run, and every object whose last reference goes is still freed. Only objects held in
    reference cycles are left to the process's end, as Python allows at exit. ``main`` itself, which tests
    and other programs call in their own process, changes nothing about the collector."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):  # one INFO line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return args.func(args)


def build_parser() -> argparse.ArgumentParser:
    from trivium import __version__

    parser = argparse.ArgumentParser(prog="trivium", description="Reinforcement fine-tuning of LLMs.")
    parser.add_argument("--version", action="version", version=f"trivium {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a config (all its stages)")
    p.add_argument("--config", "-c", required=True, help="YAML config file")
    _add_set(p)
    p.add_argument("--overwrite", action="store_true", help="delete an existing run folder of the same name")
    p.add_argument(
        "--no-resume",
        action="store_true",
        help="refuse a run folder that already holds a run (by default the run continues from its "
        "newest checkpoint)",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("check-config", help="validate a config and print it resolved, or list its problems")
    p.add_argument("config", help="YAML config file")
    _add_set(p)
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser(
        "doctor",
        help="explain a config stage by stage: batch shapes, steps, memory per role, and what to change",
    )
    p.add_argument("config", help="YAML config file")
    p.add_argument(
        "--memory",
        help="plan for this much memory per device (e.g. 24GiB, 80G) instead of this machine's",
    )
    _add_set(p)
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser(
        "debug",
        help="run one task through the configured workflow and reward, and show what the trainer would see",
    )
    p.add_argument("--config", "-c", required=True, help="YAML config file")
    p.add_argument("--stage", help="the stage to debug (default: the first that explores a task set)")
    p.add_argument("--task", type=int, default=0, help="row of the stage's task set (default 0)")
    p.add_argument(
        "--prompt", help="your own question instead of the row's (workflows with a question field)"
    )
    p.add_argument("--n", type=int, help="samples (default: the task set's repeat_times)")
    p.add_argument("--pdb", action="store_true", help="run the workflow here and stop in pdb when it raises")
    p.add_argument("--out", help="write the experiences as trajectory records (JSONL, Studio's viewer)")
    _add_set(p)
    p.set_defaults(func=_cmd_debug)

    p = sub.add_parser(
        "bench", help="evaluate a config's base model and checkpoints (mode bench, short form)"
    )
    p.add_argument("config", help="YAML config file of the run whose checkpoints to evaluate")
    p.add_argument("--checkpoints", choices=["all", "latest", "none"], default=None, help="bench.checkpoints")
    _add_set(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "example",
        help="list the shipped examples, or copy one into ./examples/NAME to run it (with what it reads from)",
    )
    p.add_argument("name", nargs="?", help="the example to copy (none: list them)")
    p.add_argument(
        "--into", default=".", help="the folder that receives examples/NAME (default: the current folder)"
    )
    p.set_defaults(func=_cmd_example)

    p = sub.add_parser(
        "make-tiny",
        help="create a tiny tokenizer + causal LM (or, --vlm, vision-language model) folder (tests, CPU runs)",
    )
    p.add_argument("out", help="output folder")
    p.add_argument(
        "--corpus",
        nargs="*",
        default=[],
        help="JSON/JSONL files whose text trains the tokenizer (default: generated word problems)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus and the initial weights (0)")
    p.add_argument("--hidden-size", type=int, default=128, help="model width (128)")
    p.add_argument("--num-layers", type=int, default=4, help="transformer layers (4)")
    p.add_argument("--num-heads", type=int, default=4, help="attention heads; must divide the width (4)")
    p.add_argument("--num-kv-heads", type=int, default=2, help="key/value heads; must divide --num-heads (2)")
    p.add_argument("--intermediate-size", type=int, default=512, help="MLP width (512)")
    p.add_argument("--vocab-size", type=int, default=384, help="BPE vocabulary size of the tokenizer (384)")
    p.add_argument(
        "--architecture",
        choices=["qwen2", "llama", "qwen2_vl"],
        default="qwen2",
        help="model architecture (qwen2); qwen2_vl: a vision-language model with its image processor",
    )
    p.add_argument("--vlm", action="store_true", help="the same as --architecture qwen2_vl (docs/vision.md)")
    p.set_defaults(func=_cmd_make_tiny)

    p = sub.add_parser("plot", help="draw reward, eval accuracy and loss of a run into a PNG")
    p.add_argument("run_dir", help="run folder (holds metrics.jsonl)")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser(
        "convert",
        help="write a checkpoint (full, LoRA adapter or sharded) as a plain Hugging Face model folder",
    )
    p.add_argument(
        "source",
        help="a checkpoint folder (runs/.../checkpoints/STAGE/step_N), model folder, "
        "LoRA adapter folder or dcp/ shards folder",
    )
    p.add_argument("out", help="output folder")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="cast the weights (default: keep float32)",
    )
    p.add_argument(
        "--no-merge",
        dest="merge",
        action="store_false",
        help="LoRA: write the adapter itself (cast) instead of merging it into its base model",
    )
    p.add_argument(
        "--base",
        default=None,
        help="the base model folder (LoRA, when the path in the adapter is gone; shards: the "
        "folder with the architecture's config.json)",
    )
    p.add_argument(
        "--from-shards",
        action="store_true",
        help="read a checkpoint's dcp/ shards instead of its consolidated model/ folder",
    )
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "check-template",
        help="tell whether a model's chat template is prefix-stable across turns (needed for multi-turn RL)",
    )
    p.add_argument("model", help="model folder or hub id (only the tokenizer is loaded)")
    p.add_argument(
        "--no-reasoning", action="store_true", help="probe without <think> blocks in assistant turns"
    )
    p.set_defaults(func=_cmd_check_template)

    p = sub.add_parser(
        "studio", help="web UI: build configs, launch, watch and compare runs (docs/studio.md)"
    )
    p.add_argument("--root", default="runs", help="the runs folder Studio reads and launches into (runs)")
    p.add_argument(
        "--configs",
        action="append",
        default=None,
        help="a folder of configs to list, edit and launch; repeatable (default: the current folder)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1; others need --token)")
    p.add_argument("--port", type=int, default=8420, help="port (8420)")
    p.add_argument(
        "--token",
        default=None,
        help="access token every request must present; 'auto': a random one (unset: a random one guards "
        "changes only, on loopback)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        dest="allowed_hosts",
        help="a name besides localhost/127.0.0.1/::1 and --host that the browser may use to reach Studio "
        "(e.g. behind a proxy); repeatable",
    )
    p.set_defaults(func=_cmd_studio)

    return parser


def _cmd_studio(args) -> int:
    from trivium.studio.server import studio_main

    return studio_main(args.root, args.configs or ["."], args.host, args.port, args.token, args.allowed_hosts)


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the config, e.g. --set trainer.lr=1e-5; a stage's field: --set "
        "stages.1.trainer.lr=1e-5 (a stage's own value wins over the top level's); repeatable",
    )


def _load(args, given_as: str = "the path after --config (-c)"):
    """The config ``args.config`` with ``--set`` overrides, or None after printing its problems."""
    from trivium.config import ConfigError
    from trivium.validation import load_config

    try:
        return load_config(args.config, args.overrides, given_as=given_as)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def _cmd_run(args) -> int:
    run_cfg = _load(args)
    if run_cfg is None:
        return 2
    from trivium.buffer.task_reader import TaskDataError
    from trivium.launch.loop import EvalFailed
    from trivium.launch.ranks import RankFailed
    from trivium.launch.ray_cluster import ClusterError
    from trivium.launch.resume import ResumeRefused
    from trivium.launch.run import RunFolderExists, run
    from trivium.launch.stopping import RunStopped
    from trivium.trainer.guard import TrainingDiverged

    try:
        run_dir = run(run_cfg, overwrite=args.overwrite, resume=not args.no_resume)
    except (
        RunFolderExists,
        TaskDataError,
        ClusterError,
        ResumeRefused,
    ) as exc:  # the message says what to do
        print(exc, file=sys.stderr)
        return 2
    except (RankFailed, TrainingDiverged, EvalFailed) as exc:  # the message says what happened and what to do
        logging.getLogger("trivium").error("%s", exc)
        return 1
    except RunStopped as exc:  # SIGTERM / Ctrl-C: a checkpoint was written, a rerun continues
        logging.getLogger("trivium").warning("%s", exc)
        return 130 if "SIGINT" in str(exc) else 143
    print(f"run folder: {run_dir}  (plot it: trivium plot {run_dir})")
    return 0


def _cmd_debug(args) -> int:
    run_cfg = _load(args)
    if run_cfg is None:
        return 2
    from trivium.launch.debug import debug_stage

    if args.n is not None and args.n < 1:
        print(f"--n {args.n}: ask for at least one sample", file=sys.stderr)
        return 2
    out = None if args.out is None else Path(args.out)
    try:
        return debug_stage(
            run_cfg, stage=args.stage, task=args.task, prompt=args.prompt, n=args.n, use_pdb=args.pdb, out=out
        )
    except ValueError as exc:  # a stage, task or prompt this config does not have: the message says which
        print(f"trivium debug: {exc}", file=sys.stderr)
        return 2


def _cmd_check(args) -> int:
    import yaml

    from trivium.config import ConfigError
    from trivium.validation import load_config

    try:  # every problem at once: fields, checks across fields, and the rows of every data file
        run_cfg = load_config(
            args.config,
            args.overrides,
            read_data=True,
            given_as="the FILE argument of trivium check-config FILE",
        )
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from trivium.launch.ray_probe import reachable_cluster_problems

    # a cluster the config joins (cluster.address) decides what fits, where it can be asked from here
    cluster_problems, cluster_notes = reachable_cluster_problems(run_cfg)
    if cluster_problems:
        print(
            ConfigError(cluster_problems, args.config, note="against the cluster it joins"), file=sys.stderr
        )
        return 2
    from trivium.trainer.precision import explain
    from trivium.validation.validate import config_notes

    for stage in run_cfg.stages:
        c = stage.config
        print(f"# stage: {stage.name}")
        if c.mode in ("both", "train"):  # what this machine gives the trainer, and why
            print(f"# {explain(c.trainer.precision, c.model)}")
        for note in config_notes(c):
            print(f"# note: {note}")
        print(yaml.safe_dump(c.model_dump(mode="json", exclude={"stages"}), sort_keys=False))
    for note in cluster_notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"OK: {args.config} is valid ({len(run_cfg.stages)} stage(s)).", file=sys.stderr)
    return 0


def _cmd_doctor(args) -> int:
    from trivium.config import ConfigError
    from trivium.validation import load_config

    try:
        run_cfg = load_config(
            args.config, args.overrides, given_as="the FILE argument of trivium doctor FILE"
        )
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from trivium.launch.config_doctor import explain
    from trivium.launch.doctor_advice import parse_size

    try:
        memory = parse_size(args.memory) if args.memory else None
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"trivium doctor: {args.config} ({len(run_cfg.stages)} stage(s))\n\n{explain(run_cfg, memory)[0]}")
    return 0


def _cmd_bench(args) -> int:
    """``trivium run`` of CONFIG as one mode-bench stage over its run's checkpoints (launch/bench.py)."""
    from trivium.config import ConfigError
    from trivium.launch.bench import bench_overrides
    from trivium.validation import load_config

    try:
        run_cfg = load_config(args.config, args.overrides, given_as="the FILE argument of trivium bench FILE")
        args.overrides = [*args.overrides, *bench_overrides(run_cfg, args.checkpoints)]
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    args.overwrite, args.no_resume = True, False  # a bench run is redone whole
    return _cmd_run(args)


def _cmd_example(args) -> int:
    from trivium.launch.shipped_examples import ExampleError, copy_example, list_examples

    try:
        if not args.name:
            for example in list_examples():
                needs = f" (copied with {', '.join(example.needs)})" if example.needs else ""
                print(f"{example.name:12s} {example.summary}{needs}")
            print("\ncopy one with: trivium example NAME  (into ./examples/NAME)")
            return 0
        written, kept = copy_example(args.name, Path(args.into))
    except ExampleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for folder in written:
        print(f"wrote {folder}")
    for folder in kept:
        print(f"kept {folder} (it was there; the example reads from it)")
    example = written[0]
    configs = sorted(example.glob("*.yaml"))
    print("run it with:")
    for config in configs:
        print(f"  trivium run --config {config}")
    return 0


def _cmd_make_tiny(args) -> int:
    from trivium.config.schema import TinyModelConfig
    from trivium.launch.build import corpus_lines
    from trivium.models.tiny import make_tiny

    vlm = args.vlm or args.architecture == "qwen2_vl"
    if args.corpus:
        corpus = list(corpus_lines(TinyModelConfig(corpus=args.corpus)))
    elif vlm:
        from trivium.tasks.shapes import generate_rows as shape_rows

        corpus = [f"{r['question']} {r['answer']}" for r in shape_rows(500, seed=args.seed)]
    else:
        from trivium.tasks.word_problems import corpus as wp_corpus
        from trivium.tasks.word_problems import generate_rows

        corpus = list(wp_corpus(generate_rows(2000, seed=args.seed)))
    sizes = {
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "num_layers": args.num_layers,
        "num_heads": args.num_heads,
        "num_kv_heads": args.num_kv_heads,
        "intermediate_size": args.intermediate_size,
        "seed": args.seed,
    }
    if vlm:
        from trivium.models.tiny_vlm import make_tiny_vlm

        out = make_tiny_vlm(args.out, corpus, **sizes)
    else:
        out = make_tiny(args.out, corpus, architecture=args.architecture, **sizes)
    print(f"tiny model written to {out}")
    return 0


def _cmd_check_template(args) -> int:
    """Exit 0 when the template is prefix-stable, 1 when it is not (the report says where), 2 on errors."""
    from trivium.models.loading import load_tokenizer
    from trivium.models.transcript import check_template, probe_conversation

    try:
        tokenizer = load_tokenizer(args.model)
    except (OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if not getattr(tokenizer, "chat_template", None):
        print(
            f"{args.model}: the tokenizer has no chat template; multi-turn workflows need one",
            file=sys.stderr,
        )
        return 2
    report = check_template(tokenizer, probe_conversation(reasoning=not args.no_reasoning))
    print(f"{args.model}: {report}")
    if not report.stable:
        print(
            "Multi-turn workflows refuse this template (workflow_args.allow_unstable_template: true overrides): "
            "they train on the conversation as sampled, which this template would render differently at inference."
        )
    return 0 if report.stable else 1


def _cmd_convert(args) -> int:
    import transformers

    from trivium.models.convert import convert

    transformers.utils.logging.disable_progress_bar()
    try:
        out = convert(
            args.source,
            args.out,
            dtype=args.dtype,
            merge=args.merge,
            base=args.base,
            from_shards=args.from_shards,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"model written to {out}")
    return 0


def _cmd_plot(args) -> int:
    from trivium.monitor.plot import plot_run

    try:
        out = plot_run(args.run_dir, args.out)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"plot written to {out}")
    return 0


if __name__ == "__main__":
    entry()
