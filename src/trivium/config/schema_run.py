"""The run-level schema sections: how a run uses the machine and the cluster, what it monitors, and the
faults it injects on purpose. ``schema.py`` assembles them into ``TriviumConfig`` and re-exports them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trivium.config.schema_base import COUNT_MAX, SECONDS_MAX, SEED_MAX, StrictModel
from trivium.config.schema_monitor import MonitorConfig  # noqa: F401 (re-exported)


class RuntimeConfig(StrictModel):
    """How this process uses the machine."""

    num_threads: int | None = Field(None, ge=1, le=4096)
    """CPU threads for torch (and OpenMP / the tokenizer pool of the processes it starts). None:
    ``OMP_NUM_THREADS`` when the environment sets it (a job scheduler's share, or a parent run's), else every
    core.
    Two runs on one machine that each take every core slow each other down many times over (OpenMP
    threads wait on each other; 28x measured on 2 cores): give each run cores / runs (docs/sharing.md)."""
    keep_freed_memory: bool = False
    """Linux (glibc) only: malloc keeps the memory a step frees for the next step instead of returning every
    large block to the kernel, which hands it back as fresh zeroed pages each time (1.4M page faults a 0.5B
    train step on a 2-core VM). The 0.5B train step 19.8 -> 17.4 s at a 0.47 GB higher peak; no change at
    the 1M and 25M shapes (docs/performance.md). The process does not give that memory back while it runs
    (up to 2 GiB of free heap); the processes it starts inherit the setting. Elsewhere: a warning, no effect."""


class ActorResources(StrictModel):
    """What one Ray actor of a role asks the cluster for (Ray's logical resources: a fraction of a CPU or a
    GPU is a share of the node's, not a limit on threads)."""

    num_cpus: float = Field(1.0, ge=0, le=COUNT_MAX)
    """CPUs the actor reserves."""
    num_gpus: float = Field(0.0, ge=0, le=1024)
    """GPUs the actor reserves (a fraction shares one GPU between actors)."""
    memory_gb: float = Field(0.0, ge=0, le=COUNT_MAX)
    """Memory the actor reserves, in GiB; 0 = no reservation."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom resources the actor reserves (Ray's ``resources``): it runs only on nodes started with them
    (``ray start --resources '{"trainer_node": 1}'``), which is how a role is placed on chosen nodes."""

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"{name!r} is set by num_cpus / num_gpus / memory_gb, not here")
            if not 0 <= amount <= COUNT_MAX:
                raise ValueError(f"{name}: {amount} is not between 0 and {COUNT_MAX}")
        return value


class ClusterConfig(StrictModel):
    """Where the roles run (docs/cluster.md): in this process and the ones it starts (local), or as Ray
    actors on a Ray cluster (ray)."""

    backend: Literal["local", "ray"] = "local"
    """local: everything in `trivium run` and the trainer-rank processes it starts (no Ray needed); ray:
    the explorer, rollout engines and trainer ranks are Ray actors placed on a Ray cluster."""
    address: str | None = None
    """ray: None = start a Ray instance for this run on this machine; 'auto' = join the cluster this
    machine belongs to (`ray start --head` / `ray start --address ...`); 'HOST:PORT' = that cluster."""
    namespace: str = ""
    """ray: the namespace of this run's named actors; empty = trivium/{project}/{name}."""
    explorer: ActorResources = Field(default_factory=lambda: ActorResources(num_cpus=0.0))
    """ray: resources of the explorer actor (on the driver's node). Its workflow threads are light (the engines
    sample), so by default it reserves nothing."""
    engine: ActorResources = Field(default_factory=ActorResources)
    """ray: resources of each rollout engine actor (explorer.engine_num of them)."""
    trainer_rank: ActorResources = Field(default_factory=ActorResources)
    """ray: resources of each trainer rank actor (trainer.world_size of them, one placement-group bundle
    each, packed on as few nodes as possible)."""
    start_timeout_s: float = Field(120.0, gt=0, le=SECONDS_MAX)
    """ray: an actor or placement group not ready after this long is an error naming it and what the
    cluster has (a request that cannot fit at all is refused before anything starts)."""
    max_restarts: int = Field(3, ge=0, le=1000)
    """ray: times a rollout engine or explorer actor that dies is restarted (its requests, or its step, are
    sent again)."""
    checkpoint_files: Literal["auto", "shared", "driver"] = "auto"
    """ray: how trainer ranks on other nodes write checkpoints and read them on resume. shared: straight
    into the run folder, which every trainer node must see at the same path (a network file system; checked
    at each save, an error naming the rank's node where it does not); driver: into a temporary folder of
    the rank's node, the files sent to the driver through Ray's object store (no shared file system needed;
    on resume the driver sends them back); auto: shared for each rank that sees the run folder, driver for
    each that does not."""


class FaultsConfig(StrictModel):
    """Faults injected on purpose to test that a run survives them (docs/faults.md); off by default. Each
    rate is a probability per call, drawn from ``seed``, so a run injects the same faults every time."""

    seed: int = Field(0, ge=0, le=SEED_MAX)
    """Seed of the draws (with the step, task and call they are for)."""
    workflow_raise: float = Field(0.0, ge=0, le=1)
    """A workflow run (each attempt of a task) raises before it starts."""
    workflow_hang: float = Field(0.0, ge=0, le=1)
    """A workflow run hangs (hang_s), so that explorer.workflow_timeout_s stops it."""
    env_raise: float = Field(0.0, ge=0, le=1)
    """An environment's reset or step raises (multi-turn workflows)."""
    env_hang: float = Field(0.0, ge=0, le=1)
    """An environment's reset or step hangs (hang_s), so that workflow_args.env_timeout_s stops it."""
    reward_raise: float = Field(0.0, ge=0, le=1)
    """A reward function call raises."""
    hang_s: float = Field(0.0, ge=0, le=SECONDS_MAX)
    """How long an injected hang lasts; 0 = 1.5 x the timeout that should stop it."""
    in_eval: bool = False
    """Inject into evaluation too (off: eval task sets measure the model, not the faults)."""
