"""LoRA: merged weights equal peft's own merge, adapters kept or replaced between stages, clear errors."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from trivium.config.schema import LoraConfig
from trivium.models import lora


@pytest.fixture
def base(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def trained_adapter(base, **kw):
    model = lora.attach(base, LoraConfig(rank=4, alpha=8, **kw))
    with torch.no_grad():  # B starts at 0: give the adapters something to merge
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    return model


def test_merged_state_dict_equals_peft_merge_and_keeps_the_plain_names(base):
    plain_names = set(base.state_dict())
    model = trained_adapter(base)
    merged = lora.merged_state_dict(model.state_dict(), lora.lora_layers(model))
    assert set(merged) == plain_names
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for name, w in reference.items():
        assert torch.allclose(merged[name], w, atol=1e-6), name
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        base.model.layers[0].self_attn.q_proj.base_layer.weight,
    )


def test_only_the_adapters_train(base):
    model = lora.attach(base, LoraConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    trainable, total = lora.trainable_parameters(model)
    assert 0 < trainable < total / 10
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_target_modules_that_match_nothing_name_the_layers(base):
    with pytest.raises(ValueError, match=r"matches no layer of Qwen2ForCausalLM.*'q_proj'"):
        lora.attach(base, LoraConfig(target_modules=["query"]))


def test_a_stage_keeps_the_same_adapters_and_merges_others_away(base):
    cfg = LoraConfig(rank=4, alpha=8)
    model = trained_adapter(base)
    assert lora.prepare(model, cfg) is model  # all-linear, expanded by peft, is the same adapter
    other = lora.prepare(model, LoraConfig(rank=8, alpha=8))
    assert other is not model and other.peft_config["default"].r == 8
    plain = lora.prepare(model, None)
    assert not lora.is_peft(plain)
    merged = lora.merged_state_dict(model.state_dict(), lora.lora_layers(model))
    assert all(torch.allclose(plain.state_dict()[k], v, atol=1e-6) for k, v in merged.items())
