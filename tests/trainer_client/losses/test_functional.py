"""Hint distillation's divergence by hand: the generalized JSD of GKD (Agarwal et al. 2024),
``β·KL(T‖M) + (1−β)·KL(S‖M)`` with ``M = β·T + (1−β)·S``, and its endpoints (0: forward
``KL(T‖S)``, 1: reverse ``KL(S‖T)``), masked and averaged per token."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_client.losses.functional import masked_jsd_loss, per_token_jsd
from trainer_client.losses.settings import SDPOConfig


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True) if a > 0)


def softmax(logits: list[float]) -> list[float]:
    z = [math.exp(x) for x in logits]
    return [x / sum(z) for x in z]


STUDENT = [[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]  # two tokens, a vocabulary of three
TEACHER = [[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]   # the second token: the same distribution


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_per_token_divergence_matches_the_definition(beta: float) -> None:
    got = per_token_jsd(torch.tensor([STUDENT]), torch.tensor([TEACHER]), beta=beta)[0]
    for position, (s_logits, t_logits) in enumerate(zip(STUDENT, TEACHER, strict=True)):
        s, t = softmax(s_logits), softmax(t_logits)
        if beta == 0:
            expected = kl(t, s)
        elif beta == 1:
            expected = kl(s, t)
        else:
            m = [beta * a + (1 - beta) * b for a, b in zip(t, s, strict=True)]
            expected = beta * kl(t, m) + (1 - beta) * kl(s, m)
        assert got[position].item() == pytest.approx(expected, abs=1e-6)
    assert got[1].item() == pytest.approx(0.0, abs=1e-7)  # equal distributions: no divergence


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_our_divergence_is_trls_sdpo_divergence_with_alpha_equal_to_jsd_beta(alpha: float) -> None:
    """TRL 1.16's ``trl.experimental.sdpo.loss_utils.compute_divergence(student_log_probs,
    teacher_log_probs, alpha)`` (SDPO's ``distillation_alpha``) is our ``per_token_jsd`` with
    ``sdpo.jsd_beta = alpha``: 0 the forward ``KL(T‖S)``, 1 the reverse ``KL(S‖T)``, 0.5 the
    symmetric generalized JSD (the seed's form), at temperature 1."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL's own switch for its experimental-module notice
    from trl.experimental.sdpo.loss_utils import compute_divergence

    generator = torch.Generator().manual_seed(0)
    student, teacher = (torch.randn(3, 5, 11, generator=generator, dtype=torch.float64) * 2 for _ in range(2))
    ours = per_token_jsd(student, teacher, beta=alpha)
    trls = compute_divergence(torch.log_softmax(student, -1), torch.log_softmax(teacher, -1), alpha)
    assert ours.shape == trls.shape == (3, 5)
    assert torch.allclose(ours, trls, atol=1e-6, rtol=0), (ours - trls).abs().max()
    assert SDPOConfig().jsd_beta == 0.5  # the default stays the symmetric form


def test_masked_mean_and_token_clip() -> None:
    student, teacher = torch.tensor([STUDENT, STUDENT]), torch.tensor([TEACHER, TEACHER])
    per_token = per_token_jsd(student, teacher)
    mask = torch.tensor([[True, True], [True, False]])
    assert masked_jsd_loss(student, teacher, mask).item() == pytest.approx(
        (2 * per_token[0, 0] + per_token[0, 1]).item() / 3, rel=1e-6)
    clipped = masked_jsd_loss(student, teacher, mask, token_clip=0.01).item()
    assert clipped == pytest.approx((2 * 0.01 + per_token[0, 1].item()) / 3, rel=1e-6)
    assert masked_jsd_loss(student, teacher, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0


def test_forward_kl_still_pulls_a_confidently_wrong_student() -> None:
    """Why ``jsd_beta: 0`` is offered: on a student sure of the wrong token (the teacher sure of
    another), the JSD is near its ceiling ln 2 and its gradient on the student's logits nearly
    vanishes, while the forward KL's gradient is the probability gap, about 1 per logit."""
    wrong, right = [12.0, 0.0, 0.0], [0.0, 12.0, 0.0]
    grads = {}
    for beta in (0.5, 0.0):
        logits = torch.tensor([[wrong]], requires_grad=True)
        per_token_jsd(logits, torch.tensor([[right]]), beta=beta).sum().backward()
        grads[beta] = logits.grad.abs().max().item()
    assert grads[0.0] == pytest.approx(1.0, abs=1e-3)  # d KL(T||S) / d s = softmax(s) - t
    assert grads[0.5] < 1e-3
    assert SDPOConfig(jsd_beta=0.0).jsd_beta == 0.0 and SDPOConfig(jsd_beta=1.0).jsd_beta == 1.0
    with pytest.raises(ValueError):
        SDPOConfig(jsd_beta=1.5)
