"""A trainer rank > 0 (``python -m trivium.launch.rank``), started by rank 0 (``ranks.RankGroup.start``).

It joins the process group, receives the model rank 0 trains (architecture, LoRA adapters, weights),
builds the same trainer on its part of the work, and makes every call rank 0 announces until told to
stop, or to release the stage's trainer: then it waits for the next stage's config and model, in the same
process and process group. It exits when rank 0's process is gone.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trivium.launch.rank", description=__doc__)
    ap.add_argument("--config", required=True, help="the stage's resolved config (JSON), written by rank 0")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--init", required=True, help="tcp://HOST:PORT of the process group")
    ap.add_argument("--plugin-dir", default=".", help="the config file's folder (for plugins)")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s rank {args.rank} %(name)s: %(message)s"
    )
    _exit_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every rank: rank 0 decides when to stop

    import torch
    import torch.distributed as dist

    from trivium.config.schema import TriviumConfig
    from trivium.launch.ranks import CommandChannel, leave_process_group, process_group_backend, rank_device
    from trivium.validation.load import load_plugins

    cfg = TriviumConfig.model_validate_json(Path(args.config).read_text())
    problems = load_plugins(cfg.plugins, Path(args.plugin_dir))
    if problems:
        raise SystemExit(f"rank {args.rank}: {problems[0]}")
    device = rank_device(cfg, args.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=cfg.synchronizer.wait_timeout_s)
    dist.init_process_group(
        process_group_backend(device),
        init_method=args.init,
        rank=args.rank,
        world_size=args.world_size,
        timeout=timeout,
    )
    channel = CommandChannel()
    parent = os.getppid()
    try:
        _serve(cfg, channel, device, args.rank, args.world_size)  # its trainer is garbage when it returns
    except Exception as error:
        if os.getppid() != parent or _peer_gone(error):  # rank 0 went first: it reports why
            logging.getLogger(__name__).error(
                "rank 0 is gone (%s): exiting", str(error).splitlines()[0][:160]
            )
            return 1
        raise
    finally:
        leave_process_group()
    return 0


def _serve(cfg, channel, device, rank: int, world_size: int) -> None:
    """Build this rank's trainer from what rank 0 sends and make every call rank 0 announces; after a stage
    that releases the ranks, the next stage's config ("stage") and model ("build") again, until "stop"."""
    import gc

    import torch

    from trivium.config.schema import TriviumConfig
    from trivium.launch import build
    from trivium.launch.ranks import follow
    from trivium.trainer.parallel import make_parallel

    while True:
        command, args = channel.receive()
        if command == "stop":
            return
        if command == "stage":
            cfg = TriviumConfig.model_validate_json(args[0])
            continue
        if command != "build":
            raise RuntimeError(f"rank 0 sent {command!r} before the model")
        (blueprint,) = args
        model = _build_model(blueprint, cfg, device)
        parallel = make_parallel(cfg.trainer.strategy, device, rank, world_size)
        trainer = build.make_trainer(
            cfg, model, blueprint["pad_token_id"], blueprint["total_steps"], parallel
        )
        if follow(trainer, channel, rank) == "stop":
            return
        trainer = model = parallel = None  # released: the next stage's trainer is built in their place
        gc.collect()  # the trainer's objects sit in reference cycles (module hooks)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _build_model(blueprint: dict, cfg, device):
    """The model rank 0 trains: built from its architecture (with the same LoRA adapters), then every
    weight received from rank 0."""
    import torch

    from trivium.launch.ranks import broadcast_weights
    from trivium.models.loading import auto_model_class, resolve_dtype

    with torch.device(device):
        model = auto_model_class(blueprint["config"]).from_config(
            blueprint["config"], dtype=resolve_dtype(cfg.model.dtype)
        )
    if blueprint["lora"] is not None:
        from peft import get_peft_model

        model = get_peft_model(model, blueprint["lora"])
    model.eval()
    broadcast_weights(model)
    return model


def _peer_gone(error: BaseException) -> bool:
    text = str(error).lower()
    return any(word in text for word in ("closed", "reset by peer", "broken pipe", "connection refused"))


def _exit_with_parent() -> None:
    """Rank 0 started this process: when it is gone (killed, crashed), so is this one."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        logging.getLogger(__name__).error("rank 0 (pid %d) is gone: exiting", parent)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _run() -> None:
    from trivium.launch.ranks import end_rank_process

    try:
        code = main()
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    end_rank_process(code)


if __name__ == "__main__":
    _run()
