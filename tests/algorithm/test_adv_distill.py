import dataclasses
import math

import pytest
import torch

from trivium.algorithm import AdvantageInputs
from trivium.algorithm.advantages import grpo
from trivium.algorithm.advantages_distill import jsd_distill, on_policy_distill

NAN = float("nan")


def tokens(old, teacher):
    """One sequence per token: ℓold and ℓT as [N, 1] (float64 when given float64)."""
    old, teacher = torch.as_tensor(old), torch.as_tensor(teacher)
    n = old.numel()
    return AdvantageInputs(
        torch.zeros(n),
        torch.zeros(n, dtype=torch.long),
        torch.ones(n, 1, dtype=torch.bool),
        torch.arange(n)[:, None],
        old_logprobs=old.reshape(n, 1),
        teacher_logprobs=teacher.reshape(n, 1),
    )


# ---- on-policy distillation (§19) ----


def test_on_policy_distill_worked_example():
    adv, metrics = on_policy_distill(tokens([-2.0], [-1.2]))  # κ = −0.8 ⇒ A = +0.8
    assert adv.item() == pytest.approx(0.8)
    assert metrics["distill/reverse_kl"] == pytest.approx(-0.8)
    adv, _ = on_policy_distill(tokens([-2.0], [-1.2]), distill_coef=0.5)
    assert adv.item() == pytest.approx(0.4)


@pytest.mark.parametrize("pack_length", [None, 16], ids=["padded", "packed"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_on_policy_distill_discount_over_later_valid_tokens(make_batch, place_values, pack_length, gamma):
    responses = [[True, False, True, True], 2, [False, True], [True, True, False]]
    batch = make_batch(responses, pack_length=pack_length)
    signal = [[0.8, -0.2, 0.5], [0.1, 0.3], [-0.4], [0.2, 0.6]]  # ℓT − ℓold on the valid tokens
    old = place_values(batch, [[-1.0] * len(s) for s in signal], fill=NAN)
    teacher = old + place_values(batch, signal, fill=NAN)
    inputs = dataclasses.replace(
        AdvantageInputs.from_batch(batch), old_logprobs=old, teacher_logprobs=teacher
    )
    adv, _ = on_policy_distill(inputs, gamma=gamma)
    # A_t = Σ_{s ≥ t, valid} γ^{s−t} A_s, counting valid tokens only (0**0 = 1: γ = 0 keeps A_t)
    expected = [
        [sum(gamma ** (s - t) * a[s] for s in range(t, len(a))) for t in range(len(a))] for a in signal
    ]
    torch.testing.assert_close(adv, place_values(batch, expected), rtol=1e-5, atol=1e-6)


def test_on_policy_distill_adds_the_weighted_task_advantage(make_batch, place_values):
    batch = make_batch([2, 1, 3], rewards=[1.0, 0.0, 0.0])
    old = place_values(batch, [[-1.0, -2.0], [-0.5], [-1.0, -1.0, -3.0]])
    teacher = place_values(batch, [[-1.5, -1.0], [-0.5], [-0.2, -2.0, -3.0]])
    inputs = dataclasses.replace(
        AdvantageInputs.from_batch(batch), old_logprobs=old, teacher_logprobs=teacher
    )
    adv, metrics = on_policy_distill(inputs, task_weight=0.5)
    task, _ = grpo(inputs)
    torch.testing.assert_close(adv, 0.5 * task + (teacher - old))
    assert metrics["task_advantage/num_groups"] == 1.0


# ---- JSD (§20b) ----


def test_jsd_worked_example():
    adv, _ = jsd_distill(tokens([-2.0], [-1.2]), beta=0.5)
    # log m = log(½e^{−1.2} + ½e^{−2}) = −1.5220465; A = −½ (−2 − log m) = +0.2389767
    log_m = math.log(0.5 * math.exp(-1.2) + 0.5 * math.exp(-2.0))
    assert log_m == pytest.approx(-1.5220465, abs=1e-7)
    assert adv.item() == pytest.approx(-0.5 * (-2.0 - log_m)) == pytest.approx(0.2389767, abs=1e-6)


def test_jsd_endpoints_follow_the_convention_and_are_the_scaled_limits():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(20, generator=gen, dtype=torch.float64) * 4
    teacher = -torch.rand(20, generator=gen, dtype=torch.float64) * 4
    inputs = tokens(old, teacher)
    reverse, _ = jsd_distill(inputs, beta=1.0)
    forward, _ = jsd_distill(inputs, beta=0.0)
    torch.testing.assert_close(reverse, on_policy_distill(inputs)[0])  # KL(P_S ‖ P_T)
    torch.testing.assert_close(forward[:, 0], torch.exp(teacher - old) - 1)  # KL(P_T ‖ P_S): P_T/P_S − 1
    eps = 1e-7
    torch.testing.assert_close(jsd_distill(inputs, beta=1 - eps)[0] / eps, reverse, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(jsd_distill(inputs, beta=eps)[0] / eps, forward, rtol=1e-5, atol=1e-6)


def kl(p, q):
    return (p * (p.log() - q.log())).sum()


def jsd(p_t, p_s, beta):
    m = beta * p_t + (1 - beta) * p_s
    return beta * kl(p_t, m) + (1 - beta) * kl(p_s, m)


@pytest.mark.parametrize(
    ("beta", "divergence"),
    [
        (0.0, lambda p_t, p_s: kl(p_t, p_s)),
        (0.3, lambda p_t, p_s: jsd(p_t, p_s, 0.3)),
        (0.5, lambda p_t, p_s: jsd(p_t, p_s, 0.5)),
        (0.9, lambda p_t, p_s: jsd(p_t, p_s, 0.9)),
        (1.0, lambda p_t, p_s: kl(p_s, p_t)),
    ],
)
def test_sampled_token_form_gives_the_exact_divergence_gradient(beta, divergence):
    """On-policy, the IS loss −ρA has expected gradient −Σ_y P_S(y) A(y) ∇ℓ(y); enumerating a
    5-token vocabulary it must equal ∇ of the divergence (§20b's identity; §19 at β = 1)."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    p_t = torch.softmax(torch.randn(5, generator=gen, dtype=torch.float64), 0)
    log_p_s = torch.log_softmax(logits, 0)
    (exact,) = torch.autograd.grad(divergence(p_t, log_p_s.exp()), logits, retain_graph=True)
    adv, _ = jsd_distill(tokens(log_p_s, p_t.log()), beta=beta)  # each vocabulary entry as a sampled token
    surrogate = -(log_p_s.exp().detach() * adv[:, 0] * log_p_s).sum()
    (sampled,) = torch.autograd.grad(surrogate, logits)
    torch.testing.assert_close(sampled, exact)


def test_distill_errors():
    inputs = tokens([-1.0], [-1.0])
    with pytest.raises(ValueError, match="0 <= beta <= 1"):
        jsd_distill(inputs, beta=1.5)
    with pytest.raises(ValueError, match="0 <= gamma <= 1"):
        on_policy_distill(inputs, gamma=-0.1)
    no_teacher = dataclasses.replace(inputs, teacher_logprobs=None)
    for fn in (on_policy_distill, jsd_distill):
        with pytest.raises(
            ValueError, match=rf"{fn.__name__} needs inputs.teacher_logprobs: add the teacher"
        ):
            fn(no_teacher)
        with pytest.raises(ValueError, match=rf"{fn.__name__} needs inputs.old_logprobs"):
            fn(dataclasses.replace(inputs, old_logprobs=None))
