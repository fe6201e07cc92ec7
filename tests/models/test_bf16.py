"""bf16 on the hardware at hand (trivium/models/bf16.py): the hardware probe for each kind of machine, and the
matrix-product emulation that gives CPUs without bf16 instructions bf16's numerics at fp32 speed."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from trivium.models import bf16
from trivium.models.bf16 import Bf16MatmulEmulation, bf16_autocast, native_bf16

CPU = torch.device("cpu")


@pytest.fixture
def no_override(monkeypatch):
    monkeypatch.delenv("TRIVIUM_FAST_BF16", raising=False)


@pytest.mark.parametrize(
    ("flags", "capability", "native"),
    [
        ({"fpu", "avx2"}, "AVX2", False),  # AMD Zen 2/3, Intel before Cooper Lake
        ({"fpu", "avx512f", "avx512bw"}, "AVX512", False),  # Skylake/Cascade Lake: AVX-512 without bf16
        ({"fpu", "avx512f", "avx512_bf16"}, "AVX512", True),  # AMD Zen 4+, Intel Cooper Lake
        ({"fpu", "amx_bf16", "amx_tile"}, "AVX512", True),  # Intel Sapphire Rapids+
        (set(), "AVX512_BF16", True),  # no /proc/cpuinfo flags, but torch's own probe found bf16
        (set(), "DEFAULT", False),  # nothing known: emulated
    ],
)
def test_cpu_probe_for_each_kind_of_cpu(no_override, flags, capability, native):
    found, why = native_bf16(CPU, flags, capability)
    assert found is native
    assert why  # every decision says what it rests on


@pytest.mark.parametrize(
    ("capability", "native"), [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)]
)
def test_cuda_probe_reads_the_compute_capability(capability, native):
    """V100 (7.0) and T4 (7.5) emulate bf16 (torch's is_bf16_supported() still says yes); A100 (8.0) and
    H100 (9.0) have bf16 tensor cores."""
    found, why = native_bf16(torch.device("cuda"), cuda_capability=capability)
    assert found is native
    assert f"{capability[0]}.{capability[1]}" in why


def test_the_override_wins_over_the_probe(monkeypatch):
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    assert native_bf16(CPU, {"fpu"}, "AVX2") == (True, "TRIVIUM_FAST_BF16=1 overrides the CPU probe")
    monkeypatch.setenv("TRIVIUM_FAST_BF16", "0")
    assert native_bf16(CPU, {"avx512_bf16"}, "AVX512_BF16")[0] is False


def test_emulation_is_used_only_where_the_cpu_lacks_bf16(monkeypatch):
    monkeypatch.setattr(bf16, "_EMULATE", None)
    monkeypatch.setattr(bf16, "cpu_flags", lambda: {"fpu", "avx512_bf16"})
    assert not bf16.emulates_bf16("cpu")
    monkeypatch.setattr(bf16, "_EMULATE", None)
    monkeypatch.setattr(bf16, "cpu_flags", lambda: {"fpu", "avx2"})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert bf16.emulates_bf16("cpu")
    assert not bf16.emulates_bf16("cuda")  # GPUs run their own kernels
    monkeypatch.setenv("TRIVIUM_BF16_EMULATION", "0")
    assert not bf16.emulates_bf16("cpu")


def _pass(model, ids, emulate: bool):
    """Logits and gradients of one forward and backward pass under bf16 autocast; the products run by
    torch's own bf16 kernels, or by the emulation."""
    model.zero_grad()
    mode = Bf16MatmulEmulation() if emulate else torch.autocast("cpu", enabled=True)  # a harmless no-op
    with mode:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        assert logits.dtype == torch.bfloat16  # autocast's decisions are untouched: the head ran in bf16
        logits.float().log_softmax(-1)[..., 0].mean().backward()
    return logits.float().detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_emulated_products_equal_torchs_bf16_kernels(tiny_model_dir):
    """bf16 x bf16 products are exact in fp32, so the emulation's only difference from a bf16 kernel is the
    order of the fp32 sums: logits agree to a few bf16 rounding steps at their scale (a rounding that tips
    the other way in one layer carries on through the next), gradients to bf16's precision."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.randint(3, 200, (4, 24), generator=torch.Generator().manual_seed(0))
    kernel_logits, kernel_grads = _pass(model, ids, emulate=False)
    emu_logits, emu_grads = _pass(copy.deepcopy(model), ids, emulate=True)
    step = 2.0 ** (torch.floor(torch.log2(kernel_logits.abs().max())) - 7)  # bf16's spacing at the scale
    assert float((emu_logits - kernel_logits).abs().max()) <= 4 * step
    assert float((emu_logits - kernel_logits).abs().mean()) <= step / 4
    with torch.no_grad():
        fp32_logits = model(input_ids=ids).logits
    # and both are bf16, not fp32: the emulation does not quietly compute in full precision
    assert float((emu_logits - fp32_logits).abs().max()) > 1e-4
    for name, g in kernel_grads.items():
        rel = float((emu_grads[name] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 3e-2, (name, rel)


def test_emulation_leaves_fp32_products_alone():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with Bf16MatmulEmulation():
        out = a @ b
    assert out.dtype == torch.float32 and torch.equal(out, a @ b)


class _Products(TorchDispatchMode):
    """Records each matrix product that reaches it, with its operands' dtypes."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.seen.append((func, tuple(a.dtype for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def test_products_into_a_given_tensor_are_emulated_too():
    """``torch.mm(a, b, out=o)`` (the chunked vocabulary head's backward) reaches the kernels as an fp32
    product of the bf16 operands, as ``a @ b`` does, and its bf16 result lands in ``o``."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g).bfloat16(), torch.randn(16, 4, generator=g).bfloat16()
    bias = torch.randn(4, generator=g).bfloat16()
    out, out_addmm = torch.empty(8, 4, dtype=torch.bfloat16), torch.empty(8, 4, dtype=torch.bfloat16)
    with _Products() as below, Bf16MatmulEmulation():
        got = torch.mm(a, b, out=out)
        torch.addmm(bias, a, b, out=out_addmm)
    assert got is out
    assert below.seen == [
        (torch.ops.aten.mm.default, (torch.float32, torch.float32)),
        (torch.ops.aten.addmm.default, (torch.float32, torch.float32, torch.float32)),
    ]
    assert torch.equal(out, (a.float() @ b.float()).bfloat16())
    assert torch.equal(out_addmm, torch.addmm(bias.float(), a.float(), b.float()).bfloat16())


def test_autocast_context_runs_the_backward_products_in_bf16_too():
    """The backward's products have bf16 operands as well: Precision.backward_context covers them."""
    from trivium.trainer.precision import Precision

    w = torch.randn(32, 32, requires_grad=True)
    x = torch.randn(4, 32)
    precision = Precision("bf16", "cpu", "test")
    with precision.autocast():
        y = x @ w
    assert y.dtype == torch.bfloat16
    with precision.backward_context():
        y.float().sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32  # the master weight's gradient is fp32
    with bf16_autocast("cpu"):
        assert torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(
    ("setting", "weights", "fast", "expected", "engine", "trainer"),
    [
        (None, torch.float32, "1", torch.float32, "transformers", "auto"),  # null: the policy's
        (None, torch.bfloat16, "0", torch.bfloat16, "transformers", "auto"),
        ("float32", torch.float32, "1", torch.float32, "transformers", "auto"),  # asked for wins
        ("bfloat16", torch.float32, "0", torch.bfloat16, "transformers", "fp32"),
        ("auto", torch.float32, "1", torch.bfloat16, "transformers", "auto"),  # bf16 hardware: bf16
        ("auto", torch.float32, "1", torch.bfloat16, "transformers", "bf16"),
        ("auto", torch.float32, "0", torch.float32, "transformers", "auto"),  # elsewhere: the policy's
        ("auto", torch.float16, "1", torch.float16, "transformers", "auto"),  # fp16 weights stay
        ("auto", torch.float32, "1", torch.float32, "transformers", "fp32"),  # fp32 training: fp32
        ("auto", torch.float32, "1", torch.float32, "vllm", "auto"),  # vLLM: bf16 only when asked for
        ("bfloat16", torch.float32, "0", torch.bfloat16, "vllm", "auto"),
    ],
)
def test_the_rollout_dtype_for_each_setting_and_machine(
    monkeypatch, setting, weights, fast, expected, engine, trainer
):
    from trivium.models.bf16 import rollout_dtype

    monkeypatch.setenv("TRIVIUM_FAST_BF16", fast)
    dtype, why = rollout_dtype(setting, weights, "cpu", engine, trainer)
    assert dtype == expected and why


def test_auto_rollouts_reach_the_engine_the_doctor_and_check_config(monkeypatch, tiny_model_dir, tmp_path):
    """On a bf16 machine (forced) ``explorer.rollout.dtype: auto`` builds a bf16 engine, the doctor sizes
    its weights in bf16 and says why; with autocast asked for, auto keeps float32 weights (autocast lowers
    them itself), and autocast over bf16 weights asked for is refused."""
    import yaml

    from trivium.launch import build
    from trivium.launch.config_doctor import explain
    from trivium.validation import load_config

    monkeypatch.setenv("TRIVIUM_FAST_BF16", "1")
    data = tmp_path / "t.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n' * 4)
    cfg = {
        "model": {"path": str(tiny_model_dir)},
        "explorer": {"rollout": {"dtype": "auto", "max_tokens": 4}},
        "buffer": {"batch_size": 2, "total_steps": 1, "taskset": {"path": str(data), "repeat_times": 2}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run_cfg = load_config(tmp_path / "c.yaml")
    stage = run_cfg.stages[0].config
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    from trivium.models.loading import load_tokenizer

    engine = build.build_rollout_model(policy, load_tokenizer(tiny_model_dir), stage, version=0).engine
    assert engine.weights_dtype == torch.bfloat16
    text, _ = explain(run_cfg)
    assert "rollout (bfloat16," in text
    assert (
        "rollout      bfloat16 weights (explorer.rollout.dtype auto): TRIVIUM_FAST_BF16=1" in text
    )  # and why
    cfg["explorer"]["rollout"]["autocast_dtype"] = "bfloat16"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    stage = load_config(tmp_path / "c.yaml").stages[0].config
    engine = build.build_rollout_model(policy, load_tokenizer(tiny_model_dir), stage, version=0).engine
    assert engine.weights_dtype == torch.float32  # autocast runs them in bf16
    cfg["explorer"]["rollout"]["dtype"] = "bfloat16"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(Exception, match="the engine's weights are already bfloat16"):
        load_config(tmp_path / "c.yaml")
