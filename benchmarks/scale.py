"""Multi-rank training, LoRA and Ray actors, measured side by side in one run.

    python benchmarks/scale.py                     # all three parts (~20 min on 2 CPU cores, the
                                                   # quickstart's SFT stage included the first time: ~3 min)
    python benchmarks/scale.py --parts layout      # part 1 only (~7 min)
    python benchmarks/scale.py --parts ray         # part 3 only (~5 min; starts and stops a Ray cluster)

Part 1, ``layout``: the trainer alone (the GRPO loss on synthetic rollouts of a fixed shape, random weights)
under strategy single, ddp 2, fsdp2 2, LoRA (rank 16) and LoRA + fsdp2 2, on the quickstart's model (~1M
parameters; 128 sequences of 64 tokens a step) and a 25M Qwen2 (hidden 512, 8 layers; 64 sequences of 144
tokens). Each row is its own set of processes: one warm-up step, then the median of ``--steps`` timed steps.
Per rank: parameter, gradient and optimizer-state bytes held by that rank (FSDP2: its shards; measured on the
tensors, gradients just before the optimizer step) and peak RSS (ru_maxrss). The machine's cores are split
between the ranks (2 threads for one rank, 1 each for two): on a 2-core CPU several ranks cannot be faster
than one, and no speed-up is claimed here; what the table shows is where the memory goes.

Part 2, ``lora``: the quickstart's GRPO stage (16 prompts x 8 samples, 100 steps, greedy eval every 10) from
its SFT checkpoint, full fine-tuning (lr 2e-4) against LoRA rank 16 on every linear layer (lr 2e-3): greedy
accuracy before and after, trainable parameters, optimizer-state bytes, median s/step.

Part 3, ``ray``: the quickstart's GRPO stage (``--ray-steps`` steps, no eval) locally and on a Ray cluster
this script starts (`ray start --head`, 2 CPUs): one engine and one rank at 0.5 CPU each, then two engines
and two DDP ranks; s/step (wall time between step records), start-up seconds, peak RSS of an engine actor
and of trainer rank 0.

Writes ``benchmarks/results/scale.md`` and ``scale.json``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MODELS = {  # name: (config, sequences per step, prompt tokens, response tokens, micro-batch)
    "quickstart ~1M": (
        {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 512, "vocab_size": 384},
        128, 40, 24, 64,
    ),
    "25M": (
        {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
         "intermediate_size": 1536, "vocab_size": 512},
        64, 48, 96, 16,
    ),
}  # fmt: skip
ROWS = [  # label, strategy, ranks, LoRA
    ("single", "single", 1, False),
    ("ddp x2", "ddp", 2, False),
    ("fsdp2 x2", "fsdp2", 2, False),
    ("LoRA r16", "single", 1, True),
    ("LoRA r16 + fsdp2 x2", "fsdp2", 2, True),
]


# ------------------------------------------------------------------------------------ part 1: a rank
def rank_main(args) -> None:
    """One rank of a layout row: train ``args.steps`` + 1 steps, report time and bytes."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2Config

    from trivium.config.schema import AlgorithmConfig, LoraConfig, TrainerConfig
    from trivium.models import lora
    from trivium.trainer.parallel import make_parallel
    from trivium.trainer.spec import AlgorithmSpec
    from trivium.trainer.trainer import Trainer

    config, n_seqs, prompt, response, micro = MODELS[args.model]
    rank, world = args.rank, args.world
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # as trivium run does: denormals slow CPU matmuls
    if world > 1 or (device.type == "cuda" and args.strategy != "single"):
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(minutes=10)
        dist.init_process_group(backend, init_method=args.init, rank=rank, world_size=world, timeout=timeout)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            Qwen2Config(**config, tie_word_embeddings=True), dtype=torch.float32
        )
    if args.lora:
        model = lora.attach(model, LoraConfig(rank=16, alpha=32))
    trainer = Trainer(
        model,
        TrainerConfig(lr=1e-4, micro_batch_size=micro),
        AlgorithmSpec.from_config(AlgorithmConfig(algorithm_type="grpo")),
        pad_token_id=0,
        total_steps=args.steps + 1,
        max_response_length=response,
        parallel=make_parallel(args.strategy, device, rank, world),
    )
    grads = {}

    def count_grads(optimizer, args, kwargs):  # gradient bytes, right before the optimizer uses them
        grads["bytes"] = sum(_local_bytes(p.grad) for p in trainer.model.parameters() if p.grad is not None)

    trainer.optim.optimizer.register_step_pre_hook(count_grads)
    batch = _rollouts(n_seqs, prompt, response, config["vocab_size"])
    times = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        trainer.train_step(batch)
        times.append(time.perf_counter() - t0)
    own = {
        "params_mb": sum(_local_bytes(p) for p in trainer.model.parameters()) / 2**20,
        "trainable_mb": sum(_local_bytes(p) for p in trainer.model.parameters() if p.requires_grad) / 2**20,
        "grads_mb": grads["bytes"] / 2**20,
        "optimizer_mb": _optimizer_bytes(trainer.optim.optimizer) / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "s_per_step": statistics.median(times[1:]),
    }
    if device.type == "cuda":
        own["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    everyone = [own]
    if world > 1:
        everyone = [None] * world
        dist.all_gather_object(everyone, own)
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank == 0:
        Path(args.out).write_text(json.dumps(everyone))


def _local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def _optimizer_bytes(optimizer) -> int:
    import torch

    return sum(
        _local_bytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )


def _rollouts(n: int, prompt: int, response: int, vocab: int):
    """``n`` sequences in groups of 8 with varied rewards: the GRPO batch shape of the rows."""
    import torch

    from trivium.types import Experience

    g = torch.Generator().manual_seed(0)
    return [
        Experience(
            tokens=torch.randint(4, vocab, (prompt + response,), generator=g),
            prompt_length=prompt,
            action_mask=torch.ones(response, dtype=torch.bool),
            logprobs=-torch.rand(response, generator=g),
            reward=float(i % 3 == 0),
            group_id=i // 8,
            run_index=i % 8,
        )
        for i in range(n)
    ]


def layout_rows(steps: int, device: str) -> list[dict]:
    records = []
    gpus = _cuda_count() if device == "cuda" else 0
    for model in MODELS:
        for label, strategy, world, use_lora in ROWS:
            if device == "cuda" and world > gpus:  # NCCL puts one rank on each GPU
                print(
                    f"| {model} | {label} | skipped: {world} ranks need {world} GPUs, this machine has {gpus} |"
                )
                continue
            out = Path(tempfile.gettempdir()) / f"trivium-scale-{os.getpid()}.json"
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
            cmd = [
                sys.executable,
                __file__,
                "--rank-of",
                model,
                "--strategy",
                strategy,
                "--world",
                str(world),
            ]
            cmd += ["--init", init, "--out", str(out), "--steps", str(steps)] + (
                ["--lora"] if use_lora else []
            )
            procs = [subprocess.Popen([*cmd, "--rank", str(r)]) for r in range(world)]
            if any(p.wait() for p in procs):
                raise SystemExit(f"row {label} on {model} failed")
            ranks = json.loads(out.read_text())
            out.unlink()
            record = {"model": model, "row": label, "ranks": ranks}
            records.append(record)
            print(_layout_line(record, records), flush=True)
    return records


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


def _layout_line(r: dict, records: list[dict]) -> str:
    base = next(x for x in records if x["model"] == r["model"] and x["row"] == "single")["ranks"][0]
    rank0 = r["ranks"][0]
    state = rank0["params_mb"] + rank0["grads_mb"] + rank0["optimizer_mb"]
    base_state = base["params_mb"] + base["grads_mb"] + base["optimizer_mb"]
    rss = " / ".join(f"{x['peak_rss_mb']:.0f}" for x in r["ranks"])
    return (
        f"| {r['model']} | {r['row']} | {rank0['s_per_step']:.3f} | {rank0['s_per_step'] / base['s_per_step']:.2f} "
        f"| {rank0['params_mb']:.1f} | {rank0['grads_mb']:.1f} | {rank0['optimizer_mb']:.1f} "
        f"| {state:.1f} ({state / base_state:.2f}) | {rss} |"
    )


LAYOUT_HEADER = (
    "| model | strategy | s/step | vs single | params MB/rank | grads MB/rank | optimizer MB/rank "
    "| state MB/rank (vs single) | peak RSS MB per rank |\n|---|---|---|---|---|---|---|---|---|"
)


# ----------------------------------------------------------------------------------- part 2: LoRA runs
def lora_rows(work: Path, steps: int) -> list[dict]:
    import yaml

    sys.path.insert(0, str(Path(__file__).parent))
    from engines import quickstart_model
    from grpo_overhead import QUICKSTART, _fix_paths

    from trivium.monitor.metrics import read_metrics

    sft = quickstart_model(work)
    records = []
    for label, lora_cfg, lr in (("full", None, 2e-4), ("LoRA r16", {"rank": 16, "alpha": 32}, 2e-3)):
        cfg = yaml.safe_load(QUICKSTART.read_text())
        grpo = cfg["stages"][1]
        name = f"scale-{label.replace(' ', '-').lower()}"
        cfg.update(project="bench", name=name, checkpoint_root=str(work), monitor={"progress_bar": False})
        cfg["model"] = {"path": str(sft), "lora": lora_cfg}
        grpo["buffer"]["total_steps"] = steps
        grpo["trainer"]["lr"] = lr
        grpo["explorer"]["eval_at_start"] = True
        cfg["stages"] = [grpo]
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        _fix_paths(path)
        subprocess.run(
            [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        rows = read_metrics(work / "bench" / name)
        accuracy = [r["eval/test/accuracy"] for r in rows if "eval/test/accuracy" in r]
        train = [r for r in rows if "train/loss" in r]
        record = {
            "row": label,
            "lr": lr,
            "accuracy_start": accuracy[0],
            "accuracy_end": accuracy[-1],
            "accuracy_curve": accuracy,
            "trainable_params": train[-1]["train/trainable_params"],
            "optimizer_mb": train[-1]["train/optimizer_mb"],
            "s_per_step": statistics.median(r["train/step_seconds"] for r in train),
            "metrics": os.path.relpath(work / "bench" / name, REPO),  # no machine paths in results
        }
        records.append(record)
        print(_lora_line(record, records), flush=True)
    return records


def _lora_line(r: dict, records: list[dict]) -> str:
    full = records[0]
    return (
        f"| {r['row']} | {r['lr']:g} | {r['accuracy_start']:.3f} -> {r['accuracy_end']:.3f} "
        f"({r['accuracy_end'] - r['accuracy_start']:+.3f}) | {r['trainable_params']:,.0f} "
        f"| {r['optimizer_mb']:.2f} | {r['s_per_step']:.3f} ({r['s_per_step'] / full['s_per_step']:.2f}) |"
    )


LORA_HEADER = (
    "| run | lr | greedy accuracy (gain) | trainable params | optimizer MB | train s/step (vs full) |\n"
    "|---|---|---|---|---|---|"
)


# ------------------------------------------------------------------------------- part 3: Ray actors
RAY_ROWS = [  # label, cluster section, engines, strategy, ranks
    ("local, 1 engine, 1 rank", None, 1, "single", 1),
    ("Ray, 1 engine, 1 rank", {"num_cpus": 0.5}, 1, "single", 1),
    ("Ray, 2 engines, 2 DDP ranks", {"num_cpus": 0.5}, 2, "ddp", 2),
]


def ray_rows(work: Path, steps: int) -> list[dict]:
    """The quickstart's GRPO stage from its SFT checkpoint, ``steps`` steps, no eval: locally and on a Ray
    cluster started here (`ray start --head`, 2 CPUs): s/step (wall time between step records), seconds
    from the command to its first step, peak RSS of the engine actor and of trainer rank 0."""

    import yaml

    sys.path.insert(0, str(Path(__file__).parent))
    from engines import quickstart_model
    from grpo_overhead import QUICKSTART, _fix_paths

    from trivium.monitor.metrics import read_metrics

    sft = quickstart_model(work)
    ray_bin = Path(sys.executable).with_name("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    subprocess.run(
        [
            str(ray_bin),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--node-ip-address=127.0.0.1",
            "--object-store-memory=300000000",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0"},
    )  # fmt: skip  (no auth on this loopback-only cluster; workers at normal priority: docs/cluster.md)
    records = []
    try:
        for label, resources, engines, strategy, ranks in RAY_ROWS:
            cfg = yaml.safe_load(QUICKSTART.read_text())
            grpo = cfg["stages"][1]
            name = "ray-" + label.split(",")[0].lower() + f"-{engines}x{ranks}"
            cfg.update(project="bench", name=name, checkpoint_root=str(work), monitor={"progress_bar": False})
            cfg["model"] = {"path": str(sft)}
            cfg["buffer"]["eval_tasksets"] = []
            grpo["buffer"]["total_steps"] = steps
            grpo["trainer"].update({"strategy": strategy, "world_size": ranks})
            cfg["explorer"]["engine_num"] = engines
            if resources is not None:
                cfg["cluster"] = {
                    "backend": "ray",
                    "address": "auto",
                    "engine": resources,
                    "trainer_rank": resources,
                }
            cfg["stages"] = [grpo]
            path = work / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            _fix_paths(path)
            env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "disabled"}
            t0 = time.time()
            cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            rows = [r for r in read_metrics(work / "bench" / name) if "train/loss" in r]
            times = [r["time"] for r in rows]
            record = {
                "row": label,
                "s_per_step": statistics.median(b - a for a, b in itertools.pairwise(times)),
                # the run's clock starts with the run; its first step ends at times[0]: what came before the
                # step's sampling and training is start-up (model, actors, engines, the first weights)
                "start_s": times[0] - rows[0]["train/step_seconds"] - rows[0].get("rollout/seconds", 0.0),
                "command_s": time.time() - t0,
                "engine_rss_mb": rows[-1].get("rollout/engine_peak_rss_mb"),
                "rank0_rss_mb": rows[-1]["train/peak_rss_mb"],
            }
            records.append(record)
            print(_ray_line(record, records), flush=True)
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True)
    return records


def _ray_line(r: dict, records: list[dict]) -> str:
    local = records[0]
    engine = "-" if r["engine_rss_mb"] is None else f"{r['engine_rss_mb']:.0f}"
    return (
        f"| {r['row']} | {r['s_per_step']:.3f} ({r['s_per_step'] / local['s_per_step']:.2f}) | {r['start_s']:.1f} "
        f"| {r['command_s']:.0f} | {engine} | {r['rank0_rss_mb']:.0f} |"
    )


RAY_HEADER = (
    "| run | s/step (vs local) | seconds to the first step | whole command, s | engine actor peak RSS MB "
    "| trainer rank 0 peak RSS MB |\n|---|---|---|---|---|---|"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--parts", nargs="+", default=["layout", "lora", "ray"], choices=["layout", "lora", "ray"]
    )
    ap.add_argument("--ray-steps", type=int, default=10, help="GRPO steps of each Ray row")
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per layout row")
    ap.add_argument("--grpo-steps", type=int, default=100, help="GRPO steps of the LoRA comparison")
    ap.add_argument("--work", default=str(REPO / "benchmarks" / "workdir"), help="models and runs (reused)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="layout rows: rank r on cuda:r")
    ap.add_argument("--rank-of", dest="rank_of", help=argparse.SUPPRESS)  # internal: run one rank
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        args.model = args.rank_of
        rank_main(args)
        return 0
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # parts not run now keep their previous results (each part says when it was measured)
    saved = RESULTS / "scale.json"
    results: dict = json.loads(saved.read_text()) if saved.exists() else {}
    stamp = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count()}
    if "layout" in args.parts:
        print(LAYOUT_HEADER, flush=True)
        results["layout"] = layout_rows(args.steps, args.device)
        results["layout_measured"] = stamp
    if "lora" in args.parts:
        print(LORA_HEADER, flush=True)
        results["lora"] = lora_rows(work, args.grpo_steps)
        results["lora_measured"] = stamp
    if "ray" in args.parts:
        print(RAY_HEADER, flush=True)
        results["ray"] = ray_rows(work, args.ray_steps)
        results["ray_measured"] = stamp
    out = ["# benchmarks/scale.py\n"]
    for part, title, header, line in (
        ("layout", "Layout: one train step per strategy", LAYOUT_HEADER, _layout_line),
        ("lora", "LoRA against full fine-tuning: the quickstart's GRPO stage", LORA_HEADER, _lora_line),
        ("ray", "Ray actors against the local backend: the quickstart's GRPO stage", RAY_HEADER, _ray_line),
    ):
        if part in results:
            when = results.get(
                f"{part}_measured", {"date": results.get("date"), "cores": results.get("cores")}
            )
            out += [f"## {title} ({when['date']}, {when['cores']} CPU cores)\n", header]
            out += [line(r, results[part]) for r in results[part]] + [""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.md").write_text("\n".join(out))
    (RESULTS / "scale.json").write_text(json.dumps(results, indent=1))
    print(f"\nwritten: {RESULTS / 'scale.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
