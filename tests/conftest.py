import os

import pytest
import torch

# Denormal floats make CPU matmuls crawl as weights shrink during training.
torch.set_flush_denormal(True)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# trainer.precision auto (and explorer.rollout.dtype auto, the defaults) can mean bf16 on CPUs with
# AVX-512-BF16/AMX: the suite's exact-number tests must mean the same on every CI machine, so auto is fp32
# here (and in the runs the tests start). The bf16 paths are tested by asking for bf16 explicitly, which runs
# on every CPU (natively, or with bf16's numerics through trivium/models/bf16.py's emulation): tests/trainer/
# test_precision.py, tests/models/test_bf16.py (auto forced to bf16 there) and the bf16 trainer and bf16
# rollout end-to-end runs in tests/launch/test_end_to_end.py.
os.environ["TRIVIUM_FAST_BF16"] = "0"
# the bf16 speed probe's measurements are kept per machine (trivium/trainer/probe_cache.py); tests measure
# afresh and write nothing into the home folder (test_precision.py turns keeping on in a temporary file)
os.environ["TRIVIUM_PROBE_CACHE"] = "0"

# pytest-xdist (pyproject's addopts: `-n auto --dist loadfile`): each worker takes its share of the cores, and
# so do the runs its tests start (trivium reads OMP_NUM_THREADS when runtime.num_threads is unset): two
# processes that each take every core slow each other down many times over (docs/sharing.md).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ["OMP_NUM_THREADS"] = os.environ["RAYON_NUM_THREADS"] = _THREADS
    torch.set_num_threads(int(_THREADS))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most 4 (each worker holds its own torch, session fixtures and
    servers; past 4 the suite's longest file, not the worker count, sets its wall time)."""
    return max(1, min(4, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def word_problem_dir(tmp_path_factory):
    """train/test/sft JSONL of the quickstart's word problems, small."""
    from trivium.tasks.word_problems import write_word_problems

    out = tmp_path_factory.mktemp("word_problems")
    write_word_problems(out, seed=0, n_train=64, n_test=16, n_sft=64)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, word_problem_dir):
    """A 2-layer, hidden-64 Qwen2 model with a tokenizer trained on the word problems."""
    from trivium.models.tiny import make_tiny
    from trivium.tasks.word_problems import corpus, generate_rows

    return make_tiny(
        tmp_path_factory.mktemp("tiny") / "model",
        list(corpus(generate_rows(300, seed=0))),
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        seed=0,
    )


@pytest.fixture(scope="module")
def vlm_dir(request, tmp_path_factory):
    """A random 2-layer, hidden-64 Qwen2-VL with its image processor; its tokenizer learns the test
    module's ``VLM_CORPUS`` (a list of strings)."""
    from trivium.models.tiny_vlm import make_tiny_vlm

    corpus = request.module.VLM_CORPUS
    return make_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model", corpus, hidden_size=64, num_layers=2)


@pytest.fixture
def vision(vlm_dir, tmp_path):
    """``vlm_dir``'s image processor over an image store in the test's folder."""
    from trivium.models.vision import ImageStore, VisionProcessor

    return VisionProcessor.from_pretrained(vlm_dir, ImageStore(tmp_path / "images"))


@pytest.fixture
def vlm_engine(vlm_dir, vision):
    """The in-process engine over ``vlm_dir`` in fp32, taking images through ``vision``."""
    from trivium.models.loading import load_causal_lm, load_tokenizer
    from trivium.models.transformers_engine import TransformersEngine

    engine = TransformersEngine(
        load_causal_lm(vlm_dir), load_tokenizer(vlm_dir), device="cpu", dtype="float32", seed=0
    )
    engine.vision = vision
    return engine


@pytest.fixture
def plugin_registries():
    """Restore every seam's registry (and forget the user modules imported meanwhile) after a test that
    imports plugins: registries are import-time constants that must not leak from one test to the next."""
    import contextlib
    import sys

    from trivium.algorithm import ADVANTAGE_FNS, AGGREGATIONS, KL_FNS, POLICY_LOSS_FNS
    from trivium.algorithm.presets import PRESETS
    from trivium.buffer.sampling import SAMPLE_STRATEGIES
    from trivium.envs.base import ENVIRONMENTS
    from trivium.rewards import REWARD_FNS
    from trivium.sync.protocol import SYNC_METHODS
    from trivium.tools import TOOLS
    from trivium.workflows.agent import AGENTS
    from trivium.workflows.registry import WORKFLOWS

    registries = [ADVANTAGE_FNS, AGGREGATIONS, KL_FNS, POLICY_LOSS_FNS, PRESETS, SAMPLE_STRATEGIES]
    registries += [ENVIRONMENTS, REWARD_FNS, TOOLS, AGENTS, WORKFLOWS, SYNC_METHODS]
    modules = set(sys.modules)
    with contextlib.ExitStack() as stack:
        for registry in registries:
            stack.enter_context(registry.snapshot())
        yield
        for name in set(sys.modules) - modules:  # the user's modules, not libraries imported meanwhile
            file = getattr(sys.modules[name], "__file__", None) or ""
            library = "site-packages" in file or file.startswith(sys.base_prefix) or "/src/trivium/" in file
            if file and not library:
                sys.modules.pop(name, None)
