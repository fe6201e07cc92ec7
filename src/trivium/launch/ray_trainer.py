"""Trainer ranks as Ray actors: one placement-group bundle per rank, the ranks forming their own
torch.distributed group, the driver making every call on all of them.

``RayTrainer`` is what the train loop talks to (the same calls as ``Trainer`` or ``ranks.LeaderTrainer``):
each collective call (``train_step``, ``export_weights``, ``save_model``, ``load_state_dict``) is sent to
every rank actor at once and rank 0's answer is returned. The model reaches the ranks through Ray's object
store (its architecture, LoRA adapters and weights): no shared file system is needed for it. Nor for
checkpoints (``cluster.checkpoint_files``, ``ray_files.py``): a rank that sees the run folder writes its
part there, one that does not sends its files to the driver, which writes them; on resume the driver sends
each such rank the files it reads.

A rank actor that dies ends the run with ``RankFailed`` naming it and its node; ``trivium run`` again
resumes from the newest checkpoint.

The rank actors outlive their stage when the next stage trains on ranks like them (``ranks_spec``: the same
world size, strategy, actor resources, plugins and collective timeout), as the engine actors do: the stage's
trainer is dropped in each actor, the process group stays, and the next stage's trainer is built there, so
a stage change does not start processes (and, on GPUs, initialise CUDA and NCCL) again.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from trivium.launch.ranks import RankFailed
from trivium.launch.ray_cluster import RayCluster, Request, placement_info
from trivium.launch.trainer_handle import COLLECTIVE, FanOutTrainer, rank_state
from trivium.launch.trainer_handle import ranks_spec as shared_ranks_spec
from trivium.trainer.model_io import SHARDS_DIR
from trivium.trainer.parallel import STRATEGIES, make_parallel

log = logging.getLogger(__name__)

__all__ = ["RayTrainer", "TrainerRankActor", "launch_ranks", "ranks_spec"]

# the rank actors kept for the next stage: {"key": their ranks_spec, "actors": [...], "names": [...]}
_LIVE: dict[str, Any] = {}


def ranks_spec(cfg) -> str:
    """What a stage's rank actors are (``trainer_handle.ranks_spec`` and the actors' Ray resources): two stages
    with the same spec train on the same actors (``RayPlacement.end_stage`` keeps them between the two)."""
    return shared_ranks_spec(cfg, resources=cfg.cluster.trainer_rank.model_dump())


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

    def configure(self, config_json: str) -> None:
        """The next stage's config, on an actor kept from the stage before (same ``ranks_spec``)."""
        from trivium.config.schema import TriviumConfig

        self.cfg = TriviumConfig.model_validate_json(config_json)

    def release(self) -> None:
        """Drop this stage's trainer (model, optimizer state), keeping the process and its process group for
        the next stage's."""
        self.trainer = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

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

        from trivium.launch import build
        from trivium.models.loading import auto_model_class, resolve_dtype

        with torch.device(self.device):
            model = auto_model_class(blueprint["config"]).from_config(
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

    def sees(self, folder: str, marker: str) -> tuple[bool, str]:
        """Whether this rank sees the driver's ``marker`` in ``folder``, and this rank's node."""
        from trivium.launch.ray_files import sees

        return sees(folder, marker), placement_info()["node"]

    def save_model(self, folder: str, through_driver: bool) -> Any:
        """Collective: this rank's part of the checkpoint ``folder``, written there, or (``through_driver``)
        written into a temporary folder of this node and returned as ``ray_files.pack`` chunks."""
        if not through_driver:
            self.trainer.save_model(Path(folder))
            return None
        from trivium.launch.ray_files import pack

        with tempfile.TemporaryDirectory(prefix="trivium-checkpoint-") as tmp:
            self.trainer.save_model(Path(tmp))
            return pack(Path(tmp))

    def load_state_dict(self, state: dict[str, Any], folder: str | None, packed: Any) -> None:
        """Collective: continue from a checkpoint's trainer state; ``packed`` (its files, sent by the driver)
        where this rank does not see ``folder``."""
        if packed is None:
            self.trainer.load_state_dict(state, None if folder is None else Path(folder))
            return
        from trivium.launch.ray_files import unpack

        with tempfile.TemporaryDirectory(prefix="trivium-resume-") as tmp:
            unpack(packed, Path(tmp))
            self.trainer.load_state_dict(state, Path(tmp))

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayTrainer(FanOutTrainer):
    """The driver's trainer over ``trainer.world_size`` rank actors (see the module docstring)."""

    COMMANDS = (*COLLECTIVE, "state_dict")

    def __init__(
        self,
        cluster: RayCluster,
        ranks: list[Any],
        algorithm,
        names: list[str],
        checkpoint_files: str = "auto",
    ):
        self.cluster, self.ranks, self.algorithm, self.names = cluster, ranks, algorithm, names
        self.checkpoint_files = checkpoint_files  # cluster.checkpoint_files of the stage
        self.said_blind = False  # the ranks that do not see the run folder were named in the log
        self.step = 0

    @classmethod
    def start(
        cls, cluster: RayCluster, cfg, stage: str, model, pad_token_id: int, total: int, config_dir: Path
    ):
        import ray

        from trivium.models import lora
        from trivium.trainer.spec import AlgorithmSpec

        world = cfg.trainer.world_size
        config_json = cfg.model_dump_json()
        if _kept(cluster, cfg):
            ranks, names = list(_LIVE["actors"]), list(_LIVE["names"])
            log.info(
                "Ray: this stage trains on the %d rank actor(s) of the stage before (%s)",
                world,
                ", ".join(names),
            )
            ray.get([a.configure.remote(config_json) for a in ranks])
        else:
            launch_ranks(cluster, cfg, stage, config_dir)  # unless launched already (the stage began so)
            (what, launch) = cluster.launched.pop("trainer")
            ranks, names = launch.wait(), [name for name, _, _ in launch.pending]
            address, port = ray.get(ranks[0].rendezvous.remote())
            ray.get([a.join.remote(address, port) for a in ranks])
            _LIVE.update(key=what[1], actors=list(ranks), names=list(names))
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
        spec = AlgorithmSpec.from_config(cfg.algorithm)
        return cls(cluster, ranks, spec, names, cfg.cluster.checkpoint_files)

    def train_step(self, batch) -> dict[str, float]:
        metrics = super().train_step(batch)
        self.step += 1
        return metrics

    def save_model(self, folder: Path) -> None:
        """Every rank's part of the checkpoint ``folder``: straight into it where a rank sees it, through the
        object store and this process where it does not (``cluster.checkpoint_files``)."""
        from trivium.launch.ray_files import unpack

        folder = Path(folder)
        through_driver = self.routes(folder.parent, "save")
        refs = [a.save_model.remote(str(folder), away) for a, away in zip(self.ranks, through_driver)]
        for packed in self._gather(refs, "save_model"):
            if packed is not None:
                unpack(packed, folder)

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        """Every rank continues from the checkpoint ``folder``; the ranks that do not see it get its
        sharded optimizer state (``dcp/``, the only files a rank reads there) from this process."""
        from trivium.launch.ray_files import pack

        through_driver = [False] * len(self.ranks)
        packed = None
        if folder is not None and (Path(folder) / SHARDS_DIR).is_dir():
            through_driver = self.routes(Path(folder).parent, "resume")
            if any(through_driver):
                packed = pack(Path(folder) / SHARDS_DIR)
                packed = [(f"{SHARDS_DIR}/{name}", chunks) for name, chunks in packed]
        where = None if folder is None else str(folder)
        refs = [
            a.load_state_dict.remote(rank_state(state), where, packed if away else None)
            for a, away in zip(self.ranks, through_driver)
        ]
        self._gather(refs, "load_state_dict")
        self.step = state["step"]

    def routes(self, folder: Path, doing: str) -> list[bool]:
        """Per rank, whether its checkpoint files go through this process (it does not see ``folder``, the
        stage's checkpoints, or ``cluster.checkpoint_files`` is driver); ``shared`` where a rank does not see
        it is a ``ClusterError`` naming the rank and its node (``ray_files.routes``)."""
        import ray

        from trivium.launch.ray_files import Visibility, routes

        if self.checkpoint_files == "driver":
            return [True] * len(self.ranks)
        check = Visibility(folder)
        with check.written() as marker:
            seen = ray.get([a.sees.remote(str(check.folder), marker) for a in self.ranks])
        away = routes(self.checkpoint_files, seen, self.names, check.folder, doing)
        if any(away) and not self.said_blind:
            self.said_blind = True
            blind = [name for name, through in zip(self.names, away) if through]
            log.info("checkpoints: %s do not see the run folder %s; their files go through the driver",
                     ", ".join(blind), check.folder)  # fmt: skip
        return away

    def state_dict(self) -> dict[str, Any]:
        import ray

        return ray.get(self.ranks[0].call.remote("state_dict"))

    def release(self) -> None:
        """The stage ended well: each rank drops its trainer and stays, for a next stage like this one
        (``RayPlacement.end_stage`` kills the ranks otherwise)."""
        import ray

        ray.get([a.release.remote() for a in self.ranks], timeout=60)

    def close(self) -> None:
        import ray

        with contextlib.suppress(ray.exceptions.RayError):  # a rank already gone has nothing to close
            ray.get([a.close.remote() for a in self.ranks], timeout=60)
        kill_ranks(self.cluster)

    def _everywhere(self, command: str, *args: Any) -> Any:
        return self._gather([a.call.remote(command, *args) for a in self.ranks], command)[0]

    def _gather(self, refs: list, command: str) -> list:
        """Every rank's answer to ``command`` (one ref per rank, in rank order); a dead rank named."""
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayError as error:
            # a dead rank makes the others' collectives fail too: name the one that died, when one did. A
            # survivor's error (gloo's "connection reset") can come first, before Ray has marked the dead
            # one's call failed: give every call a moment to settle before looking
            ray.wait(refs, num_returns=len(refs), timeout=RANK_SETTLE_S)
            dead = next((n for n, ref in zip(self.names, refs) if _failed(ref)), None)
            if dead is None:
                raise
            raise RankFailed(
                f"trainer rank actor {dead} died during {command} (trainer step {self.step + 1}): "
                f"{type(error).__name__}; the run stops. Run the same command again to resume from the newest "
                "checkpoint"
            ) from error


def kill_ranks(cluster: RayCluster) -> None:
    """Kill the rank actors (and their placement group), kept, launched or started."""
    cluster.kill("trainer")
    _LIVE.clear()


def _kept(cluster: RayCluster, cfg) -> bool:
    """Whether the rank actors of the stage before are alive and like this stage's (``ranks_spec``)."""
    live = cluster.actors.get("trainer", [])
    return bool(live) and _LIVE.get("key") == ranks_spec(cfg) and _LIVE.get("actors") == live


def launch_ranks(cluster: RayCluster, cfg, stage: str, config_dir: Path) -> None:
    """Create stage ``stage``'s ``trainer.world_size`` rank actors without waiting for them: their processes
    import torch and the package while the driver starts the rollout engines and the explorer, and
    ``RayTrainer.start`` waits for them (``cluster.start_timeout_s`` counts from here). Nothing to do where
    the ranks of the stage before are kept for this one, or where this stage's are launched already."""
    key = (stage, ranks_spec(cfg))
    if _kept(cluster, cfg) or cluster.launched.get("trainer", (None,))[0] == key:
        return
    world, r = cfg.trainer.world_size, cfg.cluster.trainer_rank
    cluster.kill("trainer")  # others kept for a stage like the one before: not like this one
    _LIVE.clear()
    cluster.check_fits([Request("cluster.trainer_rank", r, world)])
    # the rank's whole request (memory, custom resources), or its actor would not fit its bundle
    bundle = {"CPU": r.num_cpus, **Request("", r, 1).amounts()}
    group = cluster.placement_group("trainer", f"{stage}/trainer", [bundle] * world, "cluster.trainer_rank")
    config_json = cfg.model_dump_json()
    named_args = [(f"{stage}/rank-{i}", (config_json, i, world, str(config_dir))) for i in range(world)]
    launch = cluster.launch_many("trainer", TrainerRankActor, r, named_args, group=group)
    cluster.launched["trainer"] = (key, launch)
    log.info(
        "Ray: %d trainer rank actor(s) of stage %s launched; they load while the rest starts", world, stage
    )


RANK_SETTLE_S = 10.0  # how long a failed collective waits for the other ranks' calls to end, to name the dead


def _failed(ref) -> bool:
    import ray

    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError:
        return True
    except Exception:
        return False
    return False
