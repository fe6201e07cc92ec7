"""Trainer ranks on one machine: rank 0 is this process (the explorer lives here too), ranks 1..N-1 are
processes it starts for ``trainer.strategy: ddp | fsdp2`` with ``trainer.world_size: N``.

Rank 0 drives. Every collective call of the trainer (``train_step``, ``export_weights``, ``save_model``,
``load_state_dict``) is first announced to the other ranks on a command channel, then made on every rank;
the other ranks only ever follow (``follow``). So the loops of ``launch/`` stay unaware of ranks: they talk
to a ``LeaderTrainer`` as to any trainer. A stage that trains on N ranks starts its N - 1 processes and sends
them the model (architecture, LoRA adapters, weights). At its end they drop its trainer and wait: a next stage
that trains on ranks like them (``local_spec``) sends them its config and model and trains on them (no new
process, CUDA or NCCL start); otherwise they are stopped (``keep_ranks_for``).

Failures end the run with a message, never a hang: a rank that dies makes the collective in flight fail
on rank 0 (gloo sees the closed connection), which raises ``RankFailed`` naming the rank and how it ended;
a watchdog stops rank 0 if it is still blocked ``synchronizer.wait_timeout_s`` after a rank died (NCCL
waits for its own timeout); the other ranks exit when rank 0's process is gone. Run ``trivium run`` again
to resume from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trivium.faults import maybe_die
from trivium.launch.trainer_handle import COLLECTIVE, FanOutTrainer, rank_state, ranks_spec, trains

log = logging.getLogger(__name__)

__all__ = ["LeaderTrainer", "RankFailed", "RankGroup", "follow", "keep_ranks_for", "local_spec"]

COMMANDS = COLLECTIVE
# what ends ``follow``: "stop" (the process exits) or "release" (the stage's trainer is dropped, the process
# waits for the next stage's config, "stage", and model, "build")
ENDS = ("stop", "release")
CHANNEL_TIMEOUT = datetime.timedelta(days=30)  # followers wait on it while rank 0 explores


class RankFailed(RuntimeError):
    """A trainer rank died or stopped answering; the run cannot go on."""


class CommandChannel:
    """Rank 0 broadcasts ``(command, args)``; the other ranks receive them in the same order (a gloo group
    of its own, with a long timeout: the followers wait on it while rank 0 explores)."""

    def __init__(self):
        self.group = dist.new_group(backend="gloo", timeout=CHANNEL_TIMEOUT)

    def send(self, command: str, *args: Any) -> None:
        dist.broadcast_object_list([(command, args)], src=0, group=self.group)

    def receive(self) -> tuple[str, tuple]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def rank_device(cfg, rank: int) -> torch.device:
    """Rank r's device: cuda:r when the model runs on CUDA, else the CPU."""
    from trivium.models.loading import resolve_device

    device = torch.device(resolve_device(cfg.model.device))
    return torch.device("cuda", rank) if device.type == "cuda" else device


def process_group_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankGroup:
    """Rank 0's handle on the trainer ranks of one stage: processes, process group, command channel."""

    def __init__(self, cfg, procs: list[subprocess.Popen], channel: CommandChannel, parallel):
        self.cfg = cfg
        self.procs = procs
        self.channel = channel
        self.parallel = parallel
        self.world_size = cfg.trainer.world_size
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="rank-watchdog", daemon=True)
        self._watchdog.start()

    @classmethod
    def for_stage(cls, cfg, stage_name: str, run_dir: Path, plugin_dir: Path) -> RankGroup:
        """The stage's ranks: those the stage before left (``release``) when they are like this stage's
        (``local_spec``), else new ones (``start``; the old ones stopped)."""
        kept = _KEPT.pop("group", None)
        if kept is not None and _KEPT.pop("spec") == local_spec(cfg):
            try:
                kept.next_stage(cfg, stage_name)
            except BaseException:
                kept.close()
                raise
            return kept
        if kept is not None:
            kept.close()
        return cls.start(cfg, stage_name, run_dir, plugin_dir)

    @classmethod
    def start(cls, cfg, stage_name: str, run_dir: Path, plugin_dir: Path) -> RankGroup:
        """Start ranks 1..N-1 (this process is rank 0) and form the process group with them."""
        from trivium.trainer.parallel import make_parallel

        world = cfg.trainer.world_size
        device = rank_device(cfg, 0)
        init = f"tcp://127.0.0.1:{free_port()}"
        spec = run_dir / "ranks" / f"{stage_name}.json"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(cfg.model_dump_json())
        # the run's threads are shared by its ranks, rank 0 (this process) included, while the stage lasts
        env = {**os.environ, "OMP_NUM_THREADS": str(_rank_threads(cfg))}
        torch.set_num_threads(_rank_threads(cfg))
        procs = []
        for rank in range(1, world):
            cmd = [sys.executable, "-m", "trivium.launch.rank", "--config", str(spec), "--rank", str(rank)]
            cmd += ["--world-size", str(world), "--init", init, "--plugin-dir", str(plugin_dir)]
            procs.append(subprocess.Popen(cmd, env=env))
        timeout = datetime.timedelta(seconds=cfg.synchronizer.wait_timeout_s)
        try:
            dist.init_process_group(
                process_group_backend(device), init_method=init, rank=0, world_size=world, timeout=timeout
            )
            channel = CommandChannel()
        except Exception as error:
            for p in procs:
                p.kill()
            raise RankFailed(
                f"trainer ranks 1..{world - 1} did not join rank 0 at {init}: {error}"
            ) from error
        others = f"; ranks 1..{world - 1} are pids {', '.join(str(p.pid) for p in procs)}" if procs else ""
        log.info("trainer: strategy %s on %d rank(s) (%s%s)", cfg.trainer.strategy, world, device, others)
        return cls(cfg, procs, channel, make_parallel(cfg.trainer.strategy, device, 0, world))

    def next_stage(self, cfg, stage_name: str) -> None:
        """Train the next stage on these ranks (kept by ``release``): they take its config, then ``share_model``
        sends them its model."""
        self.raise_if_dead(f"the start of stage {stage_name}")
        self.cfg = cfg
        self.call("stage", cfg.model_dump_json())
        torch.set_num_threads(_rank_threads(cfg))
        pids = ", ".join(str(p.pid) for p in self.procs)
        log.info(
            "trainer: stage %s trains on the rank process(es) of the stage before (pids %s)", stage_name, pids
        )

    def release(self) -> None:
        """After a stage that ended well: the other ranks drop its trainer (model, optimizer state) and wait,
        kept for a next stage that trains on ranks like them (``for_stage``; ``keep_ranks_for`` stops them
        when none does). This process takes back the threads it lent them."""
        try:
            self.call("release")
        except BaseException:
            self.close()
            raise
        torch.set_num_threads(self.cfg.runtime.num_threads or os.cpu_count() or 1)
        _KEPT.update(group=self, spec=local_spec(self.cfg))

    def share_model(self, model: torch.nn.Module, pad_token_id: int, total_steps: int) -> None:
        """Send the other ranks what they need to build the same trainer: the model's architecture (and
        LoRA adapters), then every weight."""
        from trivium.models import lora

        blueprint = {
            "config": lora.base_model(model).config,
            "lora": model.peft_config[lora.ADAPTER] if lora.is_peft(model) else None,
            "pad_token_id": pad_token_id,
            "total_steps": total_steps,
        }
        self.call("build", blueprint)
        broadcast_weights(model)

    def call(self, command: str, *args: Any) -> None:
        """Announce ``command`` to the other ranks (they make the same call next)."""
        try:
            self.channel.send(command, *args)
        except Exception as error:
            self.raise_if_dead(f"announcing {command}", error)
            raise

    def raise_if_dead(self, during: str, error: BaseException | None = None) -> None:
        """Raise ``RankFailed`` if a rank's process has ended; otherwise return. After an ``error`` (a
        collective that failed) a rank's death may not be visible yet: gloo sees the closed connection while
        the killed process is still being torn down, so wait up to 5 s for it before deciding none died."""
        deadline = time.monotonic() + (5.0 if error is not None else 0.0)
        while True:
            dead = [(rank, p) for rank, p in enumerate(self.procs, 1) if p.poll() is not None]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not dead:
            return
        rank, proc = dead[0]
        raise RankFailed(
            f"trainer rank {rank} (pid {proc.pid}) {_how(proc.returncode)} during {during}; the run stops. "
            "Run the same command again to resume from the newest checkpoint"
        ) from error

    def close(self) -> None:
        """Stop the other ranks (after the stage, or after a failure) and leave the process group."""
        self._closed.set()
        try:
            if all(p.poll() is None for p in self.procs):
                self.channel.send("stop")
        except Exception:  # a rank already gone: nothing to tell it
            pass
        deadline = time.monotonic() + 60
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        leave_process_group()
        torch.set_num_threads(self.cfg.runtime.num_threads or os.cpu_count() or 1)

    def _watch(self) -> None:
        """A rank that dies while rank 0 waits in a collective that never fails (NCCL) would hang the run:
        stop this process ``wait_timeout_s`` after a death that nothing else noticed."""
        died_at = None
        while not self._closed.wait(1.0):
            if died_at is None and any(p.poll() is not None for p in self.procs):
                died_at = time.monotonic()
            if died_at is not None and time.monotonic() - died_at > self.cfg.synchronizer.wait_timeout_s:
                try:
                    self.raise_if_dead("a collective that did not end")
                except RankFailed as failed:
                    log.error("%s", failed)
                os._exit(1)


# the rank processes kept for the next stage (``RankGroup.release``): {"group": RankGroup, "spec": local_spec}
_KEPT: dict[str, Any] = {}


def local_spec(cfg) -> str:
    """What a stage's rank processes are (``trainer_handle.ranks_spec``, and the threads and device they
    started with)."""
    return ranks_spec(cfg, threads=_rank_threads(cfg), device=cfg.model.device)


def keep_ranks_for(following) -> None:
    """After a stage: stop the ranks it left unless ``following`` (the next stage's config; None: the run
    ends) trains on ranks like them."""
    group = _KEPT.get("group")
    if group is None:
        return
    if following is None or not trains(following) or _KEPT["spec"] != local_spec(following):
        _KEPT.clear()
        group.close()


def _rank_threads(cfg) -> int:
    """Each rank's share of the run's threads while a stage trains on ranks (rank 0's too)."""
    threads = cfg.runtime.num_threads or os.cpu_count() or 1
    return max(1, threads // cfg.trainer.world_size)


def leave_process_group() -> None:
    """Leave the process group with nothing of it left for the interpreter's teardown: the trainer's
    objects sit in reference cycles (module hooks), and a Gloo work item they still hold, freed during
    finalization, aborts the process ("terminate called without an active exception", exit -6) after
    all its work succeeded. Collect them while the interpreter is whole, then destroy the group."""
    import gc

    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def end_rank_process(code: int) -> None:
    """End a rank > 0 with ``code`` and without interpreter finalization, which would run the C++
    destructors of whatever collective state is left (see :func:`leave_process_group`); output and logs
    are flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or gone: nothing more can reach it
            stream.flush()
    os._exit(code)


def _how(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def broadcast_weights(model: torch.nn.Module) -> None:
    """Every tensor of ``model``'s state dict from rank 0 to the other ranks, in place, in name order."""
    with torch.no_grad():
        for _, tensor in sorted(model.state_dict().items()):
            dist.broadcast(tensor, src=0)


class LeaderTrainer(FanOutTrainer):
    """Rank 0's trainer in a multi-rank stage: the collective calls are announced to the other ranks,
    which make them on their part of the model; everything else is rank 0's own."""

    def __init__(self, trainer, ranks: RankGroup):
        self.trainer = trainer
        self.ranks = ranks

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model

    @property
    def algorithm(self):
        return self.trainer.algorithm

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def observer(self):
        """Rank 0's trainer's step observer (``monitor/trajectories.py``): it holds the whole batch."""
        return self.trainer.observer

    @observer.setter
    def observer(self, fn) -> None:
        self.trainer.observer = fn

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        self.ranks.call("load_state_dict", rank_state(state), folder)
        self.trainer.load_state_dict(state, folder)  # rank 0 takes the resume point and RNGs too

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def _everywhere(self, command: str, *args: Any):
        self.ranks.call(command, *args)
        try:
            return getattr(self.trainer, command)(*args)
        except Exception as error:
            self.ranks.raise_if_dead(f"{command} (trainer step {self.trainer.step + 1})", error)
            raise


def follow(trainer, channel: CommandChannel, rank: int) -> str:
    """A rank > 0: make every call rank 0 announces, until it says stop or release (returned)."""
    while True:
        command, args = channel.receive()
        if command in ENDS:
            return command
        if command not in COMMANDS:
            raise RankFailed(f"rank 0 sent an unknown command {command!r}")
        if command == "train_step":
            maybe_die(f"rank{rank}:train", trainer.step + 1)  # TRIVIUM_KILL_AT=rank1:train:3 (tests)
        getattr(trainer, command)(*args)
