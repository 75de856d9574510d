"""Trace replay's DPO, audited on one stored pair (issue 56, item 1): the loss's gradient reaches
the policy, and one plain gradient step moves the pair's margin by the sign and amount the
loss's definition gives, to first order.

With the margin ``m(θ) = (log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r))`` and DPO's loss
``L = −log σ(β m)`` (Rafailov et al. 2023, eq. 7), ``∇L = −β σ(−β m) ∇m``; a step
``θ' = θ − η ∇L`` moves the margin by ``Δm ≈ ∇m · (θ' − θ) = η β σ(−β m) ‖∇m‖²`` (> 0).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trainer_batches import make_trainer

from trainer_client.config import ReplayConfig
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.trainer import DebateGRPOTrainer
from trainer_client.trl_compat import restore_class_forward

BETA = 0.1


def _pair(tokenizer) -> DpoPair:
    question = [{"role": "user", "content": "What is 16 plus 27?"}]
    context = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=True, return_dict=False)
    chosen_ids, rejected_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                                for text in (r"13, carry 1: \boxed{43}", r"13, carry 0: \boxed{33}"))
    return DpoPair(prompt_messages=question, chosen=r"\boxed{43}", rejected=r"\boxed{33}", episode_id="a", t=0,
                   role="solver", teacher="t", created_step=0, context_ids=list(context), chosen_ids=chosen_ids,
                   rejected_ids=rejected_ids)


def test_one_step_on_one_pair_moves_its_margin_by_the_first_order_amount(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    restore_class_forward(model)  # an earlier trainer patched the shared model's forward
    config = ReplayConfig(beta=1.0, dpo_beta=BETA, pairs_per_step=1, heldout_pair_share=0.0)
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, replay=config, teacher_pool=object(),
                           pair_store=PairStore(tmp_path / "pairs.jsonl"))
    replay = trainer.trace_replay
    model.eval()  # no dropout: the margin is a function of the weights alone
    params = [p for p in model.parameters() if p.requires_grad]
    pair = _pair(tokenizer)
    with torch.no_grad():
        chosen, rejected = replay.pair_logps(model, [pair])
    # a reference the pair starts 1 nat behind: m0 = -1
    pair = pair.model_copy(update={"ref_chosen_logp": chosen.item() + 0.5, "ref_rejected_logp": rejected.item() - 0.5})

    def margin() -> torch.Tensor:
        c, r = replay.pair_logps(model, [pair])
        return (c - pair.ref_chosen_logp) - (r - pair.ref_rejected_logp)

    m0 = margin()
    grad_m = torch.autograd.grad(m0.sum(), params)
    grad_loss = torch.autograd.grad(replay.dpo_loss(model, [pair]), params)
    m0 = m0.item()
    assert m0 == pytest.approx(-1.0, abs=1e-4)
    # the gradient reaches the policy: every parameter the margin depends on, as the definition says
    factor = -BETA * torch.sigmoid(torch.tensor(-BETA * m0)).item()
    norm_sq = sum((g.double() ** 2).sum().item() for g in grad_m)
    assert norm_sq > 0
    for gl, gm in zip(grad_loss, grad_m, strict=True):
        torch.testing.assert_close(gl, factor * gm, rtol=1e-4, atol=1e-6)  # float32 sums
    # one step, sized so the first-order move is 0.05 nats
    eta = 0.05 / (-factor * norm_sq)
    with torch.no_grad():
        for p, g in zip(params, grad_loss, strict=True):
            p -= eta * g
        moved = margin().item() - m0
    predicted = eta * -factor * norm_sq
    print(f"margin {m0:.4f} -> {m0 + moved:.4f}: moved {moved:.5f}, first order {predicted:.5f}, |grad m|^2 {norm_sq:.3g}")
    assert moved > 0
    assert moved == pytest.approx(predicted, rel=0.05)
