"""``trainer.gradient_checkpointing`` (trainer/recompute.py): the decoder layers keep their inputs and attention's
outputs and recompute the rest in the backward pass: the same update (policy, PPO's critic, DPO, shared-prompt rows and
bf16 autocast alike), fewer bytes kept for the backward, the layers run again in the backward, passes
without gradients untouched, and the model's module tree and checkpoints unchanged."""

import copy

import pytest
import torch
from tests.trainer.test_shared_prompts import long_prompt_experiences, ppo_step
from tests.trainer.test_trainer import make_trainer, sampled_experiences
from torch.utils._python_dispatch import TorchDispatchMode

from trivium.config.schema import TrainerConfig
from trivium.trainer.logprobs import forward_logprobs
from trivium.trainer.recompute import ATTENTION_OPS, recompute_decoder_layers, recomputes
from trivium.types import collate


class AttentionCalls(TorchDispatchMode):
    """Counts calls of sdpa's fused kernels (``recompute.ATTENTION_OPS``)."""

    calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket in ATTENTION_OPS
        return func(*args, **(kwargs or {}))


def same_weights(a, b, atol=1e-6):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=atol), name


@pytest.mark.parametrize(
    "setting", [{}, {"share_prompts": True}, {"precision": "bf16"}], ids=["rows", "shared", "bf16"]
)
def test_a_train_step_makes_the_same_update_with_the_layers_recomputed(policy, tokenizer, setting):
    exps = long_prompt_experiences(policy, tokenizer)
    a, b = copy.deepcopy(policy), copy.deepcopy(policy)
    ma = make_trainer(a, micro=4, sgd=True, grad_clip=0.0, **setting).train_step(exps)
    trainer = make_trainer(b, micro=4, sgd=True, grad_clip=0.0, gradient_checkpointing=True, **setting)
    assert recomputes(trainer.model) and not recomputes(a)
    mb = trainer.train_step(exps)
    for key in ("train/loss", "train/grad_norm", "mismatch/logprob_abs_max"):
        assert ma[key] == pytest.approx(mb[key], abs=1e-6), key
    same_weights(a, b)
    assert not torch.allclose(next(a.parameters()), next(policy.parameters()))  # something was learned


def test_the_backward_keeps_the_layers_inputs_only_and_runs_each_layer_again(policy, tokenizer, monkeypatch):
    exps = sampled_experiences(policy, tokenizer)
    batch = collate(exps, pad_token_id=0)
    layers = policy.config.num_hidden_layers
    mlp_calls = []  # the MLP's forward calls (module hooks do not fire in checkpoint's recomputation)
    mlp_class = type(policy.model.layers[0].mlp)
    mlp_forward = mlp_class.forward

    def counted(self, *args, **kwargs):
        mlp_calls.append(1)
        return mlp_forward(self, *args, **kwargs)

    monkeypatch.setattr(mlp_class, "forward", counted)

    def kept_bytes_and_calls(model):
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        mlp_calls.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, _ = forward_logprobs(model, batch)
        forward_calls = len(mlp_calls)
        lp.sum().backward()
        return sum(storages.values()), forward_calls, len(mlp_calls) - forward_calls

    full, forward_calls, backward_calls = kept_bytes_and_calls(policy)
    assert (forward_calls, backward_calls) == (layers, 0)
    recompute = copy.deepcopy(policy)
    assert recompute_decoder_layers(recompute) == layers
    assert recompute_decoder_layers(recompute) == layers  # again: a no-op, not a second wrapping
    with AttentionCalls() as attention:
        kept, forward_calls, backward_calls = kept_bytes_and_calls(recompute)
    assert (forward_calls, backward_calls) == (layers, layers)  # every layer once more, in the backward
    assert attention.calls == layers  # ... but its attention kernel's outputs are kept, not recomputed
    # kept: the layers' inputs, the embedding's, the final norm's and the head's; at this 2-layer, hidden-64
    # shape the layers' own sets are about half of the whole
    assert kept < 0.6 * full, (kept, full)
    with torch.no_grad():  # a pass without gradients calls the layers as they are: nothing to recompute
        mlp_calls.clear()
        forward_logprobs(recompute, batch)
        assert len(mlp_calls) == layers
    assert list(recompute.state_dict()) == list(policy.state_dict())  # checkpoints are unchanged
    copied = copy.deepcopy(recompute)  # a reference model copied from it recomputes with its own weights
    assert all(layer.forward.__self__ is layer for layer in copied.model.layers)


def test_ppo_critic_and_dpo_recompute_too_and_train_the_same(policy, tokenizer):
    from trivium.config.schema import DpoConfig
    from trivium.trainer.dpo import DpoTrainer
    from trivium.types import PreferencePair

    exps = long_prompt_experiences(policy, tokenizer)
    trained, values = [], []
    for on in (False, True):
        step, models, trainer = ppo_step(policy, exps, micro_batch_size=4, gradient_checkpointing=on)
        assert recomputes(trainer.critic.model.backbone) is on
        values.append(step["loss/value"])
        trained.append(models)
    assert values[0] == pytest.approx(values[1], abs=1e-6)
    for a, b in zip(*trained):
        same_weights(a, b)

    pairs = [
        PreferencePair(
            prompt=torch.tensor(tokenizer(f"Tom has {k} pens.")["input_ids"]),
            chosen=torch.tensor(tokenizer(f" He has {k}.")["input_ids"]),
            rejected=torch.tensor(tokenizer(" None" * (k + 1))["input_ids"]),
            pair_id=str(k),
        )
        for k in range(4)
    ]
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))
    dpo = []
    for on in (False, True):
        model = copy.deepcopy(policy)
        tcfg = TrainerConfig(lr=1.0, micro_batch_size=2, grad_clip=0.0, gradient_checkpointing=on)
        trainer = DpoTrainer(model, reference, tcfg, DpoConfig(beta=0.5), pad_token_id=0, total_steps=2)
        assert recomputes(model) is on and not recomputes(reference)
        trainer.optim.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        dpo.append((trainer.train_step(pairs)["train/loss"], model))
    assert dpo[0][0] == pytest.approx(dpo[1][0], abs=1e-6)
    same_weights(dpo[0][1], dpo[1][1])


def test_compile_traces_the_recomputed_layers_and_a_model_without_layers_is_refused(policy):
    import torch._dynamo

    from trivium.trainer.compiling import compile_decoder_layers

    model = copy.deepcopy(policy)
    recompute_decoder_layers(model)
    before = torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint
    try:
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = False
        assert compile_decoder_layers(model, "fp32", "cpu") == policy.config.num_hidden_layers
        # else the `kernels` package's context variable in the layers breaks the checkpointed graph
        assert torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint
    finally:
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = before
    with pytest.raises(
        ValueError, match=r"trainer\.gradient_checkpointing: .* set trainer\.gradient_checkpointing false"
    ):
        recompute_decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))
