"""Trainer ranks as Ray actors: one placement-group bundle per rank, the ranks forming their own
torch.distributed group, the driver making every call on all of them.

``RayTrainer`` is what the train loop talks to (the same calls as ``Trainer`` or ``ranks.LeaderTrainer``):
each collective call (``train_step``, ``export_weights``, ``save_model``, ``load_state_dict``) is sent to
every rank actor at once and rank 0's answer is returned. The model reaches the ranks through Ray's object
store (its architecture, LoRA adapters and weights): no shared file system is needed for it. Checkpoints
are written by the ranks into the run folder, which must therefore be on a file system every trainer
node sees (one machine, or a network file system).

A rank actor that dies ends the run with ``RankFailed`` naming it and its node; ``trivium run`` again
resumes from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from pathlib import Path
from typing import Any

import torch

from trivium.launch.ranks import RankFailed
from trivium.launch.ray_cluster import RayCluster, Request, placement_info
from trivium.launch.trainer_handle import COLLECTIVE, FanOutTrainer
from trivium.trainer.parallel import STRATEGIES, make_parallel

log = logging.getLogger(__name__)

__all__ = ["RayTrainer", "TrainerRankActor"]


class TrainerRankActor:
    """One trainer rank (a Ray actor)."""

    def __init__(self, config_json: str, rank: int, world: int, plugin_dir: str):
        from trivium.config.schema import TriviumConfig
        from trivium.launch.ray_cluster import quiet_actor
        from trivium.validation.load import load_plugins

        quiet_actor()
        self.cfg = TriviumConfig.model_validate_json(config_json)
        problems = load_plugins(self.cfg.plugins, Path(plugin_dir))
        if problems:
            raise RuntimeError(f"trainer rank {rank}: {problems[0]}")
        self.rank, self.world = rank, world
        gpu = self.cfg.cluster.trainer_rank.num_gpus > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if gpu else torch.device("cpu")  # Ray sets the visible GPU
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.trainer = None

    def ready(self) -> dict[str, Any]:
        return placement_info()

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: an address and a free port of its node for the process group."""
        import ray

        from trivium.launch.ranks import free_port

        return ray.util.get_node_ip_address(), free_port()

    def join(self, address: str, port: int) -> None:
        import torch.distributed as dist

        if self.world == 1 and not STRATEGIES.get(self.cfg.trainer.strategy).multi_rank:
            return
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=self.cfg.synchronizer.wait_timeout_s)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=timeout,
        )

    def build(self, blueprint: dict, weights: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModelForCausalLM

        from trivium.launch import build
        from trivium.models.loading import resolve_dtype

        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(
                blueprint["config"], dtype=resolve_dtype(self.cfg.model.dtype)
            )
        if blueprint["lora"] is not None:
            from peft import get_peft_model

            model = get_peft_model(model, blueprint["lora"])
        model.load_state_dict(weights, strict=False)  # tied weights may be left out
        model.eval()
        parallel = make_parallel(self.cfg.trainer.strategy, self.device, self.rank, self.world)
        self.trainer = build.make_trainer(
            self.cfg, model, blueprint["pad_token_id"], blueprint["total_steps"], parallel
        )

    def call(self, command: str, *args: Any) -> Any:
        return getattr(self.trainer, command)(*args)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayTrainer(FanOutTrainer):
    """The driver's trainer over ``trainer.world_size`` rank actors (see the module docstring)."""

    COMMANDS = (*COLLECTIVE, "state_dict")

    def __init__(self, cluster: RayCluster, ranks: list[Any], algorithm, names: list[str]):
        self.cluster, self.ranks, self.algorithm, self.names = cluster, ranks, algorithm, names
        self.step = 0

    @classmethod
    def start(
        cls, cluster: RayCluster, cfg, stage: str, model, pad_token_id: int, total: int, config_dir: Path
    ):
        import ray

        from trivium.models import lora
        from trivium.trainer.spec import AlgorithmSpec

        world, r = cfg.trainer.world_size, cfg.cluster.trainer_rank
        cluster.check_fits([Request("cluster.trainer_rank", r, world)])
        # the rank's whole request (memory, custom resources), or its actor would not fit its bundle
        bundle = {"CPU": r.num_cpus, **Request("", r, 1).amounts()}
        group = cluster.placement_group(
            "trainer", f"{stage}/trainer", [bundle] * world, "cluster.trainer_rank"
        )
        config_json = cfg.model_dump_json()
        names = [f"{stage}/rank-{i}" for i in range(world)]
        ranks = [
            cluster.start(
                "trainer",
                TrainerRankActor,
                names[i],
                r,
                (config_json, i, world, str(config_dir)),
                group=group,
                bundle=i,
            )
            for i in range(world)
        ]
        address, port = ray.get(ranks[0].rendezvous.remote())
        ray.get([a.join.remote(address, port) for a in ranks])
        blueprint = {
            "config": lora.base_model(model).config,
            "lora": model.peft_config[lora.ADAPTER] if lora.is_peft(model) else None,
            "pad_token_id": pad_token_id,
            "total_steps": total,
        }
        weights = ray.put({k: v.detach().to("cpu") for k, v in model.state_dict().items()})
        ray.get([a.build.remote(blueprint, weights) for a in ranks])
        log.info(
            "trainer: strategy %s on %d Ray actor(s) (%s)", cfg.trainer.strategy, world, ", ".join(names)
        )
        return cls(cluster, ranks, AlgorithmSpec.from_config(cfg.algorithm), names)

    def train_step(self, batch) -> dict[str, float]:
        metrics = super().train_step(batch)
        self.step += 1
        return metrics

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        super().load_state_dict(state, folder)
        self.step = state["step"]

    def state_dict(self) -> dict[str, Any]:
        import ray

        return ray.get(self.ranks[0].call.remote("state_dict"))

    def close(self) -> None:
        import ray

        with contextlib.suppress(ray.exceptions.RayError):  # a rank already gone has nothing to close
            ray.get([a.close.remote() for a in self.ranks], timeout=60)
        self.cluster.kill("trainer")

    def _everywhere(self, command: str, *args: Any) -> Any:
        import ray

        refs = [a.call.remote(command, *args) for a in self.ranks]
        try:
            return ray.get(refs)[0]
        except ray.exceptions.RayError as error:
            # a dead rank makes the others' collectives fail too: name the one that died, when one did
            dead = next((n for n, ref in zip(self.names, refs) if _failed(ref)), None)
            if dead is None:
                raise
            raise RankFailed(
                f"trainer rank actor {dead} died during {command} (trainer step {self.step + 1}): "
                f"{type(error).__name__}; the run stops. Run the same command again to resume from the newest "
                "checkpoint"
            ) from error


def _failed(ref) -> bool:
    import ray

    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError:
        return True
    except Exception:
        return False
    return False
