"""Distillation signals as per-token advantages: on-policy reverse KL (§19) and generalised JSD (§20b).

The student samples, the teacher scores the sampled tokens (one log-prob per token, same tokenizer), and
the per-token divergence becomes an advantage for a plain IS policy gradient (or PPO clip), so
distillation reuses the RL losses unchanged and mixes with a task reward by simple addition.

Design decisions:
- Only sampled-token forms: they need ℓT of the sampled token, not the teacher's full distribution. The
  full-vocabulary JSD (§20a) needs teacher logits and is a loss, not an advantage.
- Each form is chosen so that on-policy E_{y∼P_S}[A(y) ∇ℓ(y)] = −∇(divergence); ``tests/algorithm``
  checks this identity exactly by enumerating a small vocabulary.

Left out: GKD's mixing of student and dataset sequences (a data choice for the explorer).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trivium.algorithm import advantage_parts as parts
from trivium.algorithm.advantage_parts import AdvantageInputs
from trivium.algorithm.advantages import grpo
from trivium.algorithm.registry import ADVANTAGE_FNS

__all__ = ["jsd_distill", "on_policy_distill"]

TEACHER_HINT = (
    "add the teacher to auxiliary_models and name it in algorithm.teacher; the trainer scores the "
    "sampled tokens with it (it must share the policy's tokenizer)"
)
OLD_LOGPROBS_HINT = "the trainer fills them with the behaviour policy's log-probs of the sampled tokens"


@ADVANTAGE_FNS.register("on_policy_distill")
def on_policy_distill(
    inputs: AdvantageInputs, *, distill_coef: float = 1.0, gamma: float = 0.0, task_weight: float = 0.0
) -> tuple[Tensor, dict[str, float]]:
    """Per-token reverse KL to a teacher (docs/algorithms.md §19): A_{i,t} = λ_KL (ℓT_{i,t} − ℓold_{i,t}).

    ℓold − ℓT is a one-sample estimate of KL(student ‖ teacher) at that prefix; A > 0 where the teacher
    likes the sampled token more than the student does (ℓold = −2, ℓT = −1.2 ⇒ A = +0.8). ``gamma`` > 0
    also credits each token with the discounted signal of the later valid tokens of its response,
    A_t ← Σ_{s ≥ t, valid} γ^{s−t} A_s (0 = per-token, the default). ``task_weight`` w > 0 adds the
    task reward: A = w · A_grpo + A_distill, with grpo's group-normalised advantage (needs group ids).
    ``distill_coef`` is λ_KL. Needs ``inputs.teacher_logprobs`` and ``inputs.old_logprobs``.
    """
    parts.check_unit("on_policy_distill", gamma=gamma)
    mask = inputs.mask
    old = parts.require_input(inputs, "old_logprobs", "on_policy_distill", OLD_LOGPROBS_HINT)
    teacher = parts.require_input(inputs, "teacher_logprobs", "on_policy_distill", TEACHER_HINT)
    advantages = torch.where(mask, distill_coef * (teacher - old), 0.0)
    if gamma > 0:
        grid = parts.SequenceGrid.build(mask, inputs.seq_index, inputs.rewards.numel(), "on_policy_distill")
        advantages = grid.to_tokens(parts.discounted_reverse_cumsum(grid.to_grid(advantages), gamma))
    metrics = _distill_metrics(old, teacher, mask)
    if task_weight:
        task, task_metrics = grpo(inputs)
        advantages = advantages + task_weight * task
        metrics.update({f"task_{k}": v for k, v in task_metrics.items()})
    metrics["advantage/mean"], metrics["advantage/std"] = parts.token_stats(advantages, mask)
    return advantages, metrics


@ADVANTAGE_FNS.register("jsd_distill")
def jsd_distill(
    inputs: AdvantageInputs, *, beta: float = 0.5, distill_coef: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """Generalised JSD_β(P_T ‖ P_S) to a teacher, sampled-token form (docs/algorithms.md §20b).

    For 0 < β < 1, with log m = log(β e^{ℓT} + (1 − β) e^{ℓold}):
    A_{i,t} = −λ_KL (1 − β) (ℓold_{i,t} − log m_{i,t})      (ℓold = −2, ℓT = −1.2, β = ½ ⇒ A = +0.2389767)
    which is exact: ∇JSD_β = E_{y∼P_S}[(1 − β)(log P_S(y) − log M_β(y)) ∇log P_S(y)].

    Endpoints. JSD_β vanishes identically at β = 0 and β = 1 (M_β becomes one of the two distributions),
    and so does the formula (its factor 1 − β, resp. log m = ℓold): used as is it would train nothing.
    Following §20, the endpoints are the limits of the *scaled* divergence, whose sampled-token forms are:
    - β = 1: JSD_β / (1 − β) → KL(P_S ‖ P_T), reverse KL: A = λ_KL (ℓT − ℓold), i.e. ``on_policy_distill``;
    - β = 0: JSD_β / β → KL(P_T ‖ P_S), forward KL: A = λ_KL (e^{ℓT − ℓold} − 1), the importance weight
      P_T/P_S minus the baseline 1 (E_{P_S}[∇ℓ] = 0, so the baseline changes no expectation); the
      log-ratio is clamped to [−20, 20] before exp (§0.2).
    So near the ends A ≈ β · A(β=0) and A ≈ (1 − β) · A(β=1): the scale jumps at the endpoints (by
    1/β, 1/(1 − β)); rescale ``distill_coef`` when moving between an endpoint and an interior β.
    Needs ``inputs.teacher_logprobs`` and ``inputs.old_logprobs``. Returns ``[R, L]``.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(
            f"jsd_distill needs 0 <= beta <= 1, got beta={beta} (0.5 = symmetric JSD; 0 = forward KL, "
            f"1 = reverse KL)"
        )
    mask = inputs.mask
    old = parts.require_input(inputs, "old_logprobs", "jsd_distill", OLD_LOGPROBS_HINT)
    teacher = parts.require_input(inputs, "teacher_logprobs", "jsd_distill", TEACHER_HINT)
    if beta == 1.0:
        per_token = teacher - old
    elif beta == 0.0:
        per_token = (teacher - old).clamp(-20.0, 20.0).exp() - 1.0
    else:
        log_m = torch.logaddexp(teacher + math.log(beta), old + math.log1p(-beta))
        per_token = -(1.0 - beta) * (old - log_m)
    advantages = torch.where(mask, distill_coef * per_token, 0.0)
    metrics = _distill_metrics(old, teacher, mask)
    metrics["advantage/mean"], metrics["advantage/std"] = parts.token_stats(advantages, mask)
    return advantages, metrics


def _distill_metrics(old: Tensor, teacher: Tensor, mask: Tensor) -> dict[str, float]:
    """ "distill/reverse_kl": token mean of ℓold − ℓT, the sampled estimate of KL(student ‖ teacher)."""
    return {"distill/reverse_kl": parts.token_stats(old - teacher, mask)[0]}


# Inputs the trainer must compute before calling these (read by the trainer, see AlgorithmSpec).
on_policy_distill.requires = frozenset({"old_logprobs", "teacher_logprobs"})
jsd_distill.requires = frozenset({"old_logprobs", "teacher_logprobs"})
