"""The two extra loss channels: hint-distillation JSD (SDPO) and trace-replay DPO.

Both reuse TRL's pieces rather than copies: the generalized Jensen-Shannon divergence is TRL's
GKD ``generalized_jsd_loss`` (Agarwal et al. 2024, "On-Policy Distillation of Language Models",
eq. 1) and per-token log-probabilities come from TRL's ``selective_log_softmax``. DPO has no
standalone function in TRL (it is inline in ``DPOTrainer._compute_loss``); its sigmoid loss is
one line here (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from trl.trainer.utils import selective_log_softmax

with warnings.catch_warnings():  # we knowingly reuse GKD's loss from trl.experimental
    warnings.simplefilter("ignore")
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

__all__ = ["chosen_nll", "dpo_sigmoid_loss", "masked_jsd_loss", "per_token_jsd", "sequence_logps"]


def per_token_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
                  temperature: float = 1.0) -> torch.Tensor:
    """Generalized JSD per token, summed over the vocabulary.

    Args:
        student_logits: ``(N, L, V)`` float logits (gradient flows).
        teacher_logits: ``(N, L, V)`` float logits (detached by the caller).
        beta: interpolation of the mixture ``M = beta·T + (1-beta)·S`` (0.5: symmetric JSD).
        temperature: softmax temperature applied to both.

    Returns:
        ``(N, L)`` float, nats.
    """
    elementwise = GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, labels=None, beta=beta,
                                                  temperature=temperature, reduction="none")
    return elementwise.sum(-1)


def masked_jsd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
                    beta: float = 0.5, temperature: float = 1.0, token_clip: float | None = None) -> torch.Tensor:
    """Mean per-token JSD over the tokens where ``mask`` is True, optionally clipped.

    Args:
        student_logits, teacher_logits: ``(N, L, V)``.
        mask: ``(N, L)`` bool, the erring turn's tokens.
        beta, temperature: see :func:`per_token_jsd`.
        token_clip: if set, each token's divergence is capped at this value (nats) before
            averaging, so a few very divergent tokens cannot dominate.

    Returns:
        A scalar; exactly 0 when ``mask`` has no True entry.
    """
    jsd = per_token_jsd(student_logits, teacher_logits, beta, temperature)
    if token_clip is not None:
        jsd = jsd.clamp(max=token_clip)
    weights = mask.to(jsd.dtype)
    return (jsd * weights).sum() / weights.sum().clamp(min=1.0)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of each sequence's response tokens.

    Args:
        logits: ``(N, L, V)`` logits where position ``j`` predicts ``labels[:, j]``.
        labels: ``(N, L)`` long token ids.
        mask: ``(N, L)`` bool, True on response tokens.

    Returns:
        ``(N,)`` float: ``sum_j mask·log p(labels_j)``.
    """
    logps = selective_log_softmax(logits, labels)
    return (logps * mask.to(logps.dtype)).sum(-1)


def dpo_sigmoid_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
                     ref_rejected_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's sigmoid loss, Rafailov et al. 2023 eq. 7:
    ``-log σ(β·((log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r))))``, averaged.

    Args:
        chosen_logps, rejected_logps: ``(N,)`` summed log-probs under the policy.
        ref_chosen_logps, ref_rejected_logps: ``(N,)`` the same under the reference policy.
        beta: DPO temperature (> 0).

    Returns:
        A scalar.
    """
    margin = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).mean()


def chosen_nll(chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor) -> torch.Tensor:
    """RPO's negative log-likelihood term (Pang et al. 2024, arXiv 2404.19733, Eq. 3: the NLL of
    the chosen response normalised by its length): ``mean_i(−log π(y_w,i|x_i) / |y_w,i|)``.

    Args:
        chosen_logps: ``(N,)`` summed log-probs of the chosen responses (nats).
        chosen_lengths: ``(N,)`` their token counts (float; at least 1 is used).

    Returns:
        A scalar (nats per token).
    """
    return (-chosen_logps / chosen_lengths.clamp(min=1.0)).mean()
