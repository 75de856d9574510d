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

from trainer_client.model.forward import BLOCK_ELEMENTS

with warnings.catch_warnings():  # we knowingly reuse GKD's loss from trl.experimental
    warnings.simplefilter("ignore")
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

__all__ = ["chosen_nll", "chunked_jsd_loss", "dpo_sigmoid_loss", "masked_jsd_loss", "per_token_jsd",
           "sequence_logps"]


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


def _log_softmax_(logits: torch.Tensor, probs: torch.Tensor) -> None:
    """``logits`` ← ``log_softmax(logits)`` and ``probs`` ← ``softmax(logits)``, row-wise, in place
    (``probs`` is a buffer of ``logits``' shape): six passes over the block and no allocation of
    its size, where ``torch.logsumexp`` and ``exp`` would each allocate a block-sized temporary."""
    logits.sub_(logits.amax(-1, keepdim=True))
    torch.exp(logits, out=probs)
    total = probs.sum(-1, keepdim=True)
    probs.div_(total)
    logits.sub_(total.log_())


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a * b).sum(-1)`` of two ``(n, V)`` blocks without the ``(n, V)`` product: ``(n,)``."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(a.shape[0])


def _block_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float,
               scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
               grad_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token generalized JSD of one block of logits and its gradient with respect to the
    student's logits, in closed form (the arithmetic of GKD's ``generalized_jsd_loss`` with no
    autograd graph; equal to it up to float rounding). Overwrites both inputs; every pass is in
    place, into the inputs or ``scratch`` (on CPU a block-sized temporary is a fresh ``mmap``
    whose pages fault in, which cost about a third of this function's time before).

    Gradients, with ``z`` the student's logits over ``temperature`` and ``m = β·p_T + (1−β)·p_S``:
    ``β = 0`` (``KL(T‖S)``): ``p_S − p_T``; ``β = 1`` (``KL(S‖T)``): ``p_S·(log p_S − log p_T − KL)``;
    otherwise ``(1−β)·p_S·(log p_S − log m − KL(S‖m))`` (as in TRL 1.16's
    ``trl.kernels.chunked_divergence`` backward); each divided by ``temperature``. ``log m`` is
    taken of ``m`` clamped at float32's smallest normal number: a token where both
    probabilities underflow contributes ``p·(log p − log m) = 0`` either way.

    Args:
        student_logits, teacher_logits: ``(n, V)`` float32.
        scratch: three ``(≥ n, V)`` float32 buffers to work in (``None``: allocated here).
        grad_scale: multiplies the returned gradient (the caller's ``1 / rows``, folded into
            the last pass).

    Returns:
        ``(n,)`` divergences and the ``(n, V)`` gradient of their sum times ``grad_scale`` (a
        view of ``student_logits`` or of ``scratch``).
    """
    rows = student_logits.shape[0]
    if scratch is None:
        scratch = tuple(torch.empty_like(student_logits) for _ in range(3))  # type: ignore[assignment]  # three buffers
    assert scratch is not None
    p_s, p_t, log_m = (buffer[:rows] for buffer in scratch)
    log_s, log_t = student_logits, teacher_logits
    if temperature != 1.0:
        log_s.div_(temperature)
        log_t.div_(temperature)
    _log_softmax_(log_s, p_s)
    _log_softmax_(log_t, p_t)
    scale = grad_scale / temperature
    if beta == 0.0:
        log_t.sub_(log_s)  # log p_T − log p_S
        per_token = _row_dot(p_t, log_t)
        grad = p_s.sub_(p_t).mul_(scale)
    elif beta == 1.0:
        log_s.sub_(log_t)  # log p_S − log p_T
        per_token = _row_dot(p_s, log_s)
        grad = log_s.sub_(per_token[:, None]).mul_(p_s).mul_(scale)
    else:
        torch.mul(p_s, 1 - beta, out=log_m)
        log_m.add_(p_t, alpha=beta).clamp_min_(torch.finfo(log_m.dtype).tiny).log_()
        log_s.sub_(log_m)  # log p_S − log m
        log_t.sub_(log_m)
        kl_student = _row_dot(p_s, log_s)
        per_token = beta * _row_dot(p_t, log_t) + (1 - beta) * kl_student
        grad = log_s.sub_(kl_student[:, None]).mul_(p_s).mul_((1 - beta) * scale)
    return per_token, grad


class _ChunkedJSD(torch.autograd.Function):
    """:func:`masked_jsd_loss` on hidden states, :data:`~trainer_client.model.forward.BLOCK_ELEMENTS`
    logits at a time, its gradient computed in the forward (the fused-linear pattern of
    liger-kernel's chunked losses).

    Our own rather than a library's: TRL 1.16's ``trl.kernels.chunked_divergence`` makes two
    passes over the vocabulary in its forward and recomputes both projections in its backward
    (8 vocabulary-wide matrix products per token against 4 here), liger-kernel is an optional
    extra without a per-token clip, and GKD's ``generalized_jsd_loss`` run block by block under
    autograd took 3.7x the time of :func:`_block_jsd` (CPU, 110 x 151,936 logits). The block's
    logits and working buffers are allocated once per call and reused (see :func:`_block_jsd`).
    A teacher with a head of its own (``teacher_weight``: a frozen or averaged copy's) gets its
    own product per block; without one, the student's and the teacher's rows share one product.
    """

    @staticmethod
    def forward(ctx, student: torch.Tensor, weight: torch.Tensor, teacher: torch.Tensor,  # type: ignore[override]  # autograd.Function's forward is untyped (*args)
                teacher_weight: torch.Tensor | None, beta: float, temperature: float,
                token_clip: float | None) -> torch.Tensor:
        rows, vocab = student.shape[0], weight.shape[0]
        want_student, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.detach()
        grad_student = torch.zeros_like(student) if want_student else None
        grad_weight = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if want_weight else None
        total = torch.zeros((), dtype=torch.float32, device=student.device)
        step = max(1, min(rows, BLOCK_ELEMENTS // vocab))
        # the block's two logits (student rows, then teacher rows: one product over the head for
        # both, which streams the weight once where two products stream it twice: at a 151,936 x
        # 256 head on CPU, 110 + 110 rows in one product run at 153 GFLOP/s against 117 for 110)
        # and three working buffers, allocated once and reused by every block
        logits = torch.empty((2 * step, vocab), dtype=torch.float32, device=w.device)
        scratch = torch.empty((3, step, vocab), dtype=torch.float32, device=w.device)
        # on CPU the product writes straight into the float32 buffer; elsewhere F.linear, which
        # autocast (bf16 on a GPU) applies to, where an ``out=`` product would run in float32
        in_place = w.dtype == torch.float32 and w.device.type == "cpu" and not torch.is_autocast_enabled("cpu")
        w_t = None if teacher_weight is None else teacher_weight.detach()
        for start in range(0, rows, step):
            hidden = student[start:start + step].detach()
            n = hidden.shape[0]
            if w_t is None:
                both = torch.cat([hidden, teacher[start:start + step]])
                if in_place:
                    torch.mm(both, w.t(), out=logits[:2 * n])
                else:
                    logits[:2 * n].copy_(F.linear(both, w))
            else:  # the teacher's own head: one product per side
                for rows_of, head, into in ((hidden, w, logits[:n]), (teacher[start:start + step], w_t, logits[n:2 * n])):
                    if in_place and head.dtype == torch.float32:
                        torch.mm(rows_of.to(head.dtype), head.t(), out=into)
                    else:
                        into.copy_(F.linear(rows_of.to(head.dtype), head))
            per_token, grad = _block_jsd(logits[:n], logits[n:2 * n], beta, temperature,
                                         (scratch[0], scratch[1], scratch[2]), grad_scale=1.0 / max(rows, 1))
            if token_clip is not None:  # clamp: a token above the cap passes no gradient
                grad.mul_((per_token <= token_clip).to(grad.dtype)[:, None])
                per_token = per_token.clamp(max=token_clip)
            total += per_token.sum() / max(rows, 1)
            with torch.autocast(w.device.type, enabled=False):  # the dtypes are chosen here, float32 accumulation
                if grad_student is not None:
                    grad_student[start:start + step] = grad.to(w.dtype) @ w
                if grad_weight is not None:
                    grad_weight.addmm_(grad.t(), hidden.float())
        ctx.save_for_backward(grad_student, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]  # autograd.Function's backward is untyped
        grad_student, grad_weight = ctx.saved_tensors
        return (None if grad_student is None else grad_student * grad_output.to(grad_student.dtype),
                None if grad_weight is None else (grad_weight * grad_output).to(ctx.weight_dtype),
                None, None, None, None, None)


def chunked_jsd_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: torch.Tensor,
                     beta: float = 0.5, temperature: float = 1.0, token_clip: float | None = None,
                     teacher_weight: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`masked_jsd_loss` of ``F.linear(student_hidden, weight)`` against
    ``F.linear(teacher_hidden, teacher_weight)`` (``weight`` when ``teacher_weight`` is ``None``)
    over every row, without building the ``(N, V)`` logits:
    at most :data:`~trainer_client.model.forward.BLOCK_ELEMENTS` logits exist at a time, and the gradients of the student's
    hidden states and of ``weight`` are computed block by block in the forward (kept until the
    backward scales them: one ``(N, H)`` and one float32 ``(V, H)`` tensor). Same value as the
    full-logits loss up to float rounding, and the same gradients
    (``tests/trainer_client/losses/test_loss_identity.py``); it costs the same four
    vocabulary-wide products per token (two logits, two gradients).

    Args:
        student_hidden: ``(N, H)`` float, the rows to distil (gradient flows).
        teacher_hidden: ``(N, H_T)`` float (no gradient); ``H_T = H`` without ``teacher_weight``.
        weight: ``(V, H)`` the output embedding (LM head without bias, softcap or scale).
        beta, temperature, token_clip: see :func:`masked_jsd_loss`.
        teacher_weight: ``(V, H_T)`` the teacher's own output embedding (a frozen ``base`` or
            ``ema`` copy's; no gradient), ``None`` when the teacher shares ``weight``. It costs one
            more vocabulary-wide product per token, not the ``(N, V)`` logits of both sides.

    Returns:
        A float32 scalar: the mean per-token divergence (0 without rows).

    Raises:
        ValueError: shapes that do not match.
    """
    if teacher_weight is None:
        if student_hidden.dim() != 2 or student_hidden.shape != teacher_hidden.shape or weight.dim() != 2 \
                or weight.shape[1] != student_hidden.shape[1]:
            raise ValueError(f"student {tuple(student_hidden.shape)}, teacher {tuple(teacher_hidden.shape)} and "
                             f"weight {tuple(weight.shape)}: need (N, H), (N, H) and (V, H)")
    elif student_hidden.dim() != 2 or teacher_hidden.dim() != 2 or weight.dim() != 2 or teacher_weight.dim() != 2 \
            or student_hidden.shape[0] != teacher_hidden.shape[0] or weight.shape[1] != student_hidden.shape[1] \
            or teacher_weight.shape != (weight.shape[0], teacher_hidden.shape[1]):
        raise ValueError(f"student {tuple(student_hidden.shape)}, teacher {tuple(teacher_hidden.shape)}, weight "
                         f"{tuple(weight.shape)} and teacher weight {tuple(teacher_weight.shape)}: need (N, H), "
                         "(N, H_T), (V, H) and (V, H_T)")
    out = _ChunkedJSD.apply(student_hidden, weight, teacher_hidden.detach(),
                            None if teacher_weight is None else teacher_weight.detach(), beta, temperature, token_clip)
    assert isinstance(out, torch.Tensor)
    return out


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
