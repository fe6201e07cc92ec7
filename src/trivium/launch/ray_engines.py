"""Rollout engines as Ray actors, and the pool that samples from them as one ``RolloutModel``.

Each ``EngineActor`` holds a ``TransformersEngine`` over its own copy of the policy (built from the
model's config; weights through Ray's object store, so no shared file system is needed for them). The
driver's explorer samples from an ``EnginePool`` inside its usual ``BatchingRolloutModel``: every batch of
requests is split into ``engine_num`` contiguous shards, one per engine, sampled in parallel. A weight
update is put into the object store once and loaded by every engine; the post-load check asks every
engine for its checksum (they must agree).

An engine actor that dies (its process killed, out of memory) is restarted by Ray
(``cluster.max_restarts``); the pool then loads the newest weights into it again and sends the failed
shard once more, so every request of a step is answered, counted in ``rollout/engine_restarts``. A
restarted engine's sampling RNG starts afresh: a run with a restart is not bit-reproducible.

With the explorer as an actor (``ray_explorer.py``), two pools share the engine actors: the driver's
loads each sync's weights (``update_weights``), the explorer actor's samples and is told which weights are
the newest (``follow``), so either can bring a restarted engine back.

The engine actors outlive their stage when the next stage asks for the same engines (``engines_spec``
equal: engine type, count, resources, dtypes, seed, model): the next stage's pool takes them over and loads
its starting weights into them, as the in-process vLLM engine is shared between stages
(``VllmEngine.for_policy``). Starting an engine is the slow part (a vLLM engine: ~40 s on a 2-core CPU,
minutes for a large model on a GPU); between stages that ask for different engines, or before a stage
without a rollout model, the old ones are killed so their resources are free (``launch/run.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from trivium.launch.ray_cluster import ClusterError, RayCluster, Request, placement_info, wait_restarted
from trivium.models.bf16 import rollout_dtype
from trivium.models.protocol import Generation, SamplingParams
from trivium.models.weights import WeightSyncError

log = logging.getLogger(__name__)

__all__ = ["EngineActor", "EnginePool", "engines_spec"]

_POOLS = itertools.count()  # engine actor names stay unique within a run's namespace
_LIVE: dict[
    str, Any
] = {}  # the engine actors now running: {"key": what they were started for, "actors": [...]}


def engines_spec(cfg) -> str:
    """What a stage's engine actors are, as a comparable string: two stages with the same spec can share
    the actors (the policy's architecture is compared too, when the pool starts)."""
    r = cfg.explorer.rollout
    fields = {
        "engine_num": cfg.explorer.engine_num,
        "resources": cfg.cluster.engine.model_dump(),
        "max_restarts": cfg.cluster.max_restarts,
        "seed": cfg.seed,
        "model": cfg.model.model_dump(),
        "rollout": r.model_dump(
            include={"engine_type", "dtype", "autocast_dtype", "in_flight_updates", "vllm_kv_cache_gb",
                     "vllm_gpu_memory_utilization", "vllm_enforce_eager"}
        ),
    }  # fmt: skip
    return json.dumps(fields, sort_keys=True, default=str)


class EngineActor:
    """One rollout engine (a Ray actor): the same ``generate`` / ``update_weights`` as the in-process one."""

    def __init__(self, config, tokenizer, engine_type: str, engine_args: dict):
        """The model from its config alone: the weights arrive by ``update_weights`` (after a restart too),
        so constructor arguments stay small and never point at an object that may go out of scope.
        ``engine_type`` vllm: vLLM starts on the randomly initialised model (it loads from a folder) and
        the first ``update_weights`` loads the real weights in place."""
        from trivium.launch.ray_cluster import quiet_actor
        from trivium.models.loading import auto_model_class

        quiet_actor()
        model = auto_model_class(config).from_config(config, dtype=torch.float32)
        if engine_type == "vllm":
            from trivium.models.vllm_engine import VllmEngine

            self.engine = VllmEngine.from_policy(model, tokenizer, version=-1, **engine_args)
            del model
            return
        from trivium.models.transformers_engine import TransformersEngine

        self.engine = TransformersEngine(model, tokenizer, **engine_args)

    def ready(self) -> dict[str, Any]:
        return placement_info()

    def reseed(self, seed: int) -> None:
        """Sample from ``seed`` on, as a newly started engine would (a later stage took this actor over). A
        vLLM engine keeps its one engine seed's stream (it takes no other), as in-process between stages."""
        generator = getattr(self.engine, "generator", None)
        if generator is not None:
            generator.manual_seed(seed)

    def generate(self, prompts, params: SamplingParams, media=None) -> list[list[Generation]]:
        if media is None:
            return self.engine.generate(prompts, params)
        return self.engine.generate(prompts, params, media=media)  # a vision-language model's images

    def update_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.engine.update_weights(weights, version)

    def weights_checksum(self) -> str:
        return self.engine.weights_checksum()

    def version(self) -> int:
        return self.engine.version

    def sampler_state(self) -> dict:
        return self.engine.sampler_state()

    def load_sampler_state(self, state: dict) -> None:
        self.engine.load_sampler_state(state)

    def metrics(self) -> dict[str, float]:
        """The engine's own counters, and this process's peak RSS."""
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        return {**self.engine.metrics(), "rollout/engine_peak_rss_mb": peak}


class EnginePool:
    """``RolloutModel`` over ``engine_num`` engine actors (see the module docstring)."""

    def __init__(self, cfg, actors: list[Any], tokenizer, dtype: torch.dtype, meta: dict, version: int):
        """``cfg``: the ``cluster`` section (restarts and timeouts); ``meta``: max_length and eos_ids."""
        self.cfg, self.actors, self.meta = cfg, actors, meta
        self._tokenizer, self._dtype = tokenizer, dtype
        self.max_length, self.eos_ids = meta["max_length"], meta["eos_ids"]
        self.version = version
        self.vision = None  # the image processor and store of a vision-language policy (set by start)
        self._weights: tuple[Any, int] | None = None  # the newest update's object ref and version
        self.restarts = 0

    @classmethod
    def start(
        cls, cluster: RayCluster, policy: torch.nn.Module, tokenizer, cfg, version: int, stage: str
    ) -> EnginePool:
        """``explorer.engine_num`` engine actors over ``policy``'s weights (``cluster.engine`` each)."""
        from trivium.launch.build import vision_processor
        from trivium.models.protocol import eos_token_ids

        n = cfg.explorer.engine_num
        r = cfg.explorer.rollout
        architecture = {k: v for k, v in policy.config.to_dict().items() if k != "_name_or_path"}
        key = json.dumps([engines_spec(cfg), architecture], sort_keys=True, default=str)
        meta = {
            "max_length": policy.config.get_text_config().max_position_embeddings,
            "eos_ids": eos_token_ids(tokenizer, policy.generation_config, "EnginePool"),
        }
        vision = vision_processor(cfg, policy)
        if vision is not None:  # an explorer actor's pool loads the image processor from the same folder
            meta["vision_source"] = policy.name_or_path
        weights = next(policy.parameters()).dtype
        dtype, _ = rollout_dtype(
            r.dtype, weights, cfg.model.device, r.engine_type, cfg.trainer.precision, r.autocast_dtype
        )
        live = cluster.actors.get("engine", [])
        if live and _LIVE.get("key") == key and _LIVE.get("actors") == live:
            log.info(
                "Ray: this stage samples from the %d rollout engine(s) of the stage before (%s/engines-*), "
                "with weights version %d loaded into them",
                len(live), stage, version,
            )  # fmt: skip
            pool = cls(cluster.cfg, list(live), tokenizer, dtype, meta, version)
            pool.vision = vision
            pool._each(lambda i, actor: actor.reseed.remote(cfg.seed + i))  # as the engines started below
            pool.update_weights(policy.state_dict(), version)
            return pool
        cluster.kill("engine")  # others started for another stage (launch/run.py keeps only equal ones)
        _LIVE.clear()
        cluster.check_fits([Request("cluster.engine", cfg.cluster.engine, n)])
        pool_id = next(_POOLS)
        named_args = []
        for i in range(n):
            # engine 0: as in-process; auto is resolved here, on the driver's hardware (docs/engines.md)
            args = {"dtype": str(dtype).removeprefix("torch."), "seed": cfg.seed + i}
            if r.engine_type == "vllm":
                args |= {
                    "kv_cache_gb": r.vllm_kv_cache_gb,
                    "gpu_memory_utilization": r.vllm_gpu_memory_utilization,
                    "enforce_eager": r.vllm_enforce_eager,
                }
            else:
                device = "cuda" if cfg.cluster.engine.num_gpus > 0 else "cpu"
                args |= {
                    "device": device,
                    "autocast_dtype": r.autocast_dtype,
                    "in_flight_updates": r.in_flight_updates,
                }
            named_args.append(
                (f"{stage}/engines-{pool_id}/{i}", (policy.config, tokenizer, r.engine_type, args))
            )
        actors = cluster.start_many(
            "engine", EngineActor, cfg.cluster.engine, named_args, max_restarts=cfg.cluster.max_restarts
        )
        _LIVE.update(key=key, actors=list(actors))
        pool = cls(cluster.cfg, actors, tokenizer, dtype, meta, version)
        pool.vision = vision
        pool.update_weights(policy.state_dict(), version)  # the starting weights, through the object store
        return pool

    # --- RolloutModel -------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def weights_dtype(self) -> torch.dtype:
        return self._dtype

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, media=None
    ) -> list[list[Generation]]:
        """Contiguous shards of ``prompts`` (and their images), one per engine, sampled in parallel; results
        in prompt order."""
        size = -(-len(prompts) // len(self.actors))
        shards = {i: list(prompts[i * size : (i + 1) * size]) for i in range(len(self.actors))}
        shards = {i: s for i, s in shards.items() if s}
        if media is None:
            results = self._each(lambda i, actor: actor.generate.remote(shards[i], params), list(shards))
        else:
            images = {i: list(media[i * size : (i + 1) * size]) for i in shards}
            results = self._each(
                lambda i, actor: actor.generate.remote(shards[i], params, images[i]), list(shards)
            )
        return [gen for i in shards for gen in results[i]]

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        import ray

        ref = ray.put({k: v.detach().to("cpu") for k, v in state_dict.items()})
        self._weights = (ref, version)  # a restarted engine gets these too
        self._each(lambda i, actor: actor.update_weights.remote(ref, version))
        self.version = version

    def follow(self, ref, version: int) -> None:
        """Another pool over the same engines (the explorer actor's) loaded weights ``ref`` of ``version``
        into them: a restarted engine gets these, and ``version`` is what is sampled now."""
        self._weights, self.version = (ref, version), version

    def newest(self) -> tuple[Any, int]:
        """The object ref and version of the newest weights loaded into the engines."""
        if self._weights is None:
            raise RuntimeError("EnginePool.newest: no weights were loaded into the engines yet")
        return self._weights

    def weights_checksum(self) -> str:
        sums = list(self._each(lambda i, actor: actor.weights_checksum.remote()).values())
        if len(set(sums)) > 1:
            raise WeightSyncError(
                f"the {len(sums)} rollout engines hold different weights after version {self.version} "
                f"(checksums {sorted({s[:12] for s in sums})})"
            )
        return sums[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError("engines on Ray keep their weights in their actors: use weights_checksum()")

    def sampler_state(self) -> dict:
        states = self._each(lambda i, actor: actor.sampler_state.remote())
        return {"engines": [states[i] for i in range(len(self.actors))]}

    def load_sampler_state(self, state: dict) -> None:
        saved = state.get("engines")
        if saved is None or len(saved) != len(self.actors):
            log.warning(
                "the saved sampler state is from %s engine(s): sampling continues from fresh RNGs",
                len(saved or []),
            )
            return
        self._each(lambda i, actor: actor.load_sampler_state.remote(saved[i]))

    def metrics(self) -> dict[str, float]:
        """Restarts so far, the largest peak RSS of an engine actor, and the engines' counters summed
        (in-flight weight loads)."""
        answers = list(self._each(lambda i, actor: actor.metrics.remote()).values())
        summed: dict[str, float] = {}
        for answer in answers:
            for key, value in answer.items():
                summed[key] = summed.get(key, 0.0) + value
        summed["rollout/engine_peak_rss_mb"] = max(a["rollout/engine_peak_rss_mb"] for a in answers)
        return {"rollout/engine_restarts": float(self.restarts), **summed}

    # --- failures -----------------------------------------------------------------------------------
    def _each(self, call: Callable[[int, Any], Any], which: list[int] | None = None) -> dict[int, Any]:
        """``call(i, actor)`` (a remote call) for each engine ``i``, answers by engine. An engine that died is
        restarted by Ray, reloaded with the newest weights and called again, up to ``cluster.max_restarts``
        times in one call."""
        import ray

        which = list(range(len(self.actors))) if which is None else which
        refs = {i: call(i, self.actors[i]) for i in which}
        out: dict[int, Any] = {}
        failures = 0
        while refs:
            i, ref = next(iter(refs.items()))
            try:
                out[i] = ray.get(ref)
                del refs[i]
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as error:
                failures += 1
                if failures > self.cfg.max_restarts:
                    raise ClusterError(
                        f"rollout engines died {failures} time(s) in one call; cluster.max_restarts="
                        f"{self.cfg.max_restarts} reached (last: engine {i}, {type(error).__name__})"
                    ) from error
                self._recover(i, error)
                refs[i] = call(i, self.actors[i])
        return out

    def _recover(self, i: int, error: BaseException) -> None:
        """Wait for Ray to restart engine ``i``, then give it the newest weights."""
        import ray

        self.restarts += 1
        log.warning("rollout engine %d died (%s): waiting for its restart", i, type(error).__name__)
        actor = self.actors[i]
        where = wait_restarted(actor, self.cfg, f"rollout engine {i}", error)
        if self._weights is not None:
            ref, version = self._weights
            ray.get(actor.update_weights.remote(ref, version))
        log.warning(
            "rollout engine %d restarted on node %s %s (weights version %d); its requests are sent again",
            i,
            where["node"],
            where["node_id"][:12],
            self.version,
        )
