"""trainer.compile: the compiled decoder layers train exactly like eager ones, checkpoints keep their names,
and bf16's emulation (which the compiler cannot trace) leaves the model eager with a warning."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from tests.trainer.test_trainer import make_trainer, sampled_experiences

from trivium.trainer import compiling
from trivium.trainer.parallel import decoder_layers


def test_trainer_compile_compiles_each_decoder_layer_in_place(policy):
    """The wiring alone (no pass runs, so nothing is compiled yet): the default suite's share of this file."""
    names = list(policy.state_dict())
    make_trainer(policy, micro=8, precision="fp32", compile=True)
    layers = decoder_layers(policy)
    assert layers and all(layer._compiled_call_impl is not None for layer in layers)
    assert list(policy.state_dict()) == names


@pytest.mark.slow  # inductor's first compile of a layer's forward and backward: 35-55 s on 2 cores
def test_compiled_layers_train_like_eager_ones(policy, tokenizer):
    experiences = sampled_experiences(policy, tokenizer)
    eager_model, compiled_model = copy.deepcopy(policy), copy.deepcopy(policy)
    names = list(compiled_model.state_dict())
    eager = make_trainer(eager_model, micro=8, sgd=True, precision="fp32")
    compiled = make_trainer(compiled_model, micro=8, sgd=True, precision="fp32", compile=True)
    layers = decoder_layers(compiled_model)
    assert layers and all(layer._compiled_call_impl is not None for layer in layers)
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(eager_model))
    for _ in range(2):  # the second step runs the compiled code again, on changed weights
        m_eager = eager.train_step(experiences)
        m_compiled = compiled.train_step(experiences)
        assert (
            abs(m_eager["train/grad_norm"] - m_compiled["train/grad_norm"])
            < 1e-4 * m_eager["train/grad_norm"]
        )
    for (name, a), b in zip(eager_model.state_dict().items(), compiled_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)
    assert list(compiled_model.state_dict()) == names  # checkpoints are written under the same names


def test_bf16_emulation_leaves_the_model_eager(policy, monkeypatch, caplog):
    monkeypatch.setattr(compiling, "emulates_bf16", lambda device_type: True)
    with caplog.at_level(logging.WARNING, logger=compiling.__name__):
        assert compiling.compile_decoder_layers(policy, "bf16", "cpu") == 0
    assert "emulation" in caplog.text
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(policy))
    assert compiling.compile_decoder_layers(policy, "fp32", "cpu") == len(decoder_layers(policy))
