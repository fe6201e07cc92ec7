"""The docs/algorithms.md walkthrough: a policy loss in the user's own module, named by dotted path."""

from pathlib import Path

import pytest
import torch

from trivium.algorithm import POLICY_LOSS_FNS, PolicyLossInputs, actor_loss, loss_scale

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_loss"


@pytest.fixture
def capped_pg(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return POLICY_LOSS_FNS.get("capped_pg:capped_pg")


def test_dotted_path_loss_matches_hand_computed_values(capped_pg):
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0 - 1.0, -0.5]])  # ρ = 1, e ≈ 2.718 (capped to 2), 1
    inputs = PolicyLossInputs(
        logprobs=lp,
        old_logprobs=old,
        advantages=torch.tensor([[1.0, 1.0, -1.0]]),
        mask=torch.tensor([[True, True, False]]),
        seq_index=torch.zeros(1, 3, dtype=torch.long),
    )
    scale = loss_scale(inputs.mask, inputs.seq_index, norm_constant=3.0)
    loss, metrics = actor_loss(
        inputs,
        policy_loss="capped_pg:capped_pg",
        policy_loss_args={"cap": 2.0},
        aggregation="token-mean",
        scale=scale,
    )
    # λ = −w·A·ℓ on the two masked tokens: −1·1·(−1) = 1 and −2·1·(−2) = 4; token-mean = 2.5
    assert float(loss.detach()) == pytest.approx(2.5)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.5, -1.0, 0.0])  # −w·A / n, 0 off the mask
    assert metrics["capped_pg/capped_fraction"] == pytest.approx(0.5)


def test_example_config_validates_with_the_users_module(monkeypatch):
    from trivium.validation import load_config

    monkeypatch.syspath_prepend(str(EXAMPLE))
    run = load_config(EXAMPLE / "grpo_capped_pg.yaml", check_files=False)
    assert run.stages[0].config.algorithm.policy_loss_fn == "capped_pg:capped_pg"
