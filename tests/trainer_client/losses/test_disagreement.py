"""Trace replay over the tokens where a pair disagrees (``replay.pair_tokens: disagreement``):
the weights by hand, the margin against plain DPO's, the stored per-token references against
the frozen reference, and what a few steps do to the shared text."""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trainer_batches import make_trainer

from trainer_client.config import ReplayConfig
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.losses.replay_pairs import cap_response, disagreement_weights
from trainer_client.trainer import DebateGRPOTrainer
from trainer_client.trl_compat import restore_class_forward


def test_weights_by_hand() -> None:
    # first difference at token 2; after it the tails [3, 4, 5, 9] and [7, 4, 5, 9] share [4, 5, 9]
    assert disagreement_weights([1, 2, 3, 4, 5, 9], [1, 2, 7, 4, 5, 9]) == ([0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0])
    assert disagreement_weights([1, 2, 3, 4, 5, 9], [1, 2, 7, 4, 5, 9], 0.5) == (
        [0, 0, 1, 0.5, 0.5, 0.5], [0, 0, 1, 0.5, 0.5, 0.5])
    # shared text at another offset (one extra token on the rejected side) is found as shared
    assert disagreement_weights([1, 8, 4, 5], [1, 7, 7, 4, 5]) == ([0, 1, 0, 0], [0, 1, 1, 0, 0])
    assert disagreement_weights([1, 2], [1, 2, 3]) == ([0, 0], [0, 0, 1])  # a prefix of the other
    assert disagreement_weights([1, 2], [1, 2]) == ([0, 0], [0, 0])  # identical: nothing to prefer
    with pytest.raises(ValueError, match="shared_weight"):
        disagreement_weights([1], [2], 1.5)


def _pair(tokenizer, chosen: str, rejected: str, name: str) -> DpoPair:
    context = tokenizer.apply_chat_template([{"role": "user", "content": "What is 16 plus 27?"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    chosen_ids, rejected_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                                for text in (chosen, rejected))
    return DpoPair(prompt_messages=[{"role": "user", "content": "What is 16 plus 27?"}], chosen=chosen, rejected=rejected,
                   episode_id=name, t=0, role="solver", teacher="t", created_step=0, context_ids=list(context),
                   chosen_ids=chosen_ids, rejected_ids=rejected_ids)


CHOSEN = r"13, carry 1: \boxed{43}"  # the tiny tokenizer's sides stay under max_completion_length (32)
REJECTED = r"13, carry 0: \boxed{33}"


def _trainer(model_and_tokenizer, tmp_path, **replay):
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    restore_class_forward(model)  # an earlier trainer patched the shared model's forward
    config = ReplayConfig(beta=1.0, dpo_beta=0.1, pairs_per_step=2, heldout_pair_share=0.0, **replay)
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, replay=config, teacher_pool=object(),
                           pair_store=PairStore(tmp_path / "pairs.jsonl"))
    return model, tokenizer, trainer


def test_the_stored_token_references_are_the_frozen_reference_s(model_and_tokenizer, tmp_path) -> None:
    """Reference log-probs stored with each pair: per token, summing to the stored sums, and
    equal to the frozen initial policy's log-probs taken through the plain (summed) path."""
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, pair_tokens="disagreement")
    replay = trainer.trace_replay
    pairs = [_pair(tokenizer, CHOSEN, REJECTED, "a"), _pair(tokenizer, r"So \boxed{43}", r"So \boxed{33}", "b")]
    replay._set_token_references(pairs)
    with torch.no_grad():
        plain_chosen, plain_rejected = replay.pair_logps(model, pairs)
    for pair, c, r in zip(pairs, plain_chosen.tolist(), plain_rejected.tolist(), strict=True):
        limit = trainer.max_completion_length  # sides are scored capped, their last token kept
        assert len(pair.ref_chosen_token_logps) == len(cap_response(pair.chosen_ids, limit))
        assert len(pair.ref_rejected_token_logps) == len(cap_response(pair.rejected_ids, limit))
        assert sum(pair.ref_chosen_token_logps) == pytest.approx(pair.ref_chosen_logp, abs=1e-5)
        assert (pair.ref_chosen_logp, pair.ref_rejected_logp) == pytest.approx((c, r), rel=1e-5, abs=1e-4)
        assert all(v < 0 for v in pair.ref_rejected_token_logps)
    # a trained policy no longer gives them: they are the reference's, kept
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
        moved, _ = replay.pair_logps(model, pairs)
    assert (moved - plain_chosen).abs().max() > 1e-3


def test_with_shared_text_weighted_fully_the_margin_is_dpo_s(model_and_tokenizer, tmp_path) -> None:
    """The shared prefix cancels in DPO's margin, so weight 1 on the shared text gives plain
    DPO's loss; weight 0 gives the margin over the disagreeing tokens alone, computed here by hand
    from per-token log-probs."""
    model, tokenizer, full = _trainer(model_and_tokenizer, tmp_path / "full", pair_tokens="disagreement", shared_weight=1.0)
    pairs = [_pair(tokenizer, CHOSEN, REJECTED, "a"), _pair(tokenizer, r"So \boxed{43}", r"So \boxed{33}", "b")]
    full.trace_replay._set_token_references(pairs)
    with torch.no_grad():
        for parameter in model.parameters():  # a policy other than the reference: a non-zero margin
            parameter.mul_(1.02)
        plain = ReplayConfig(beta=1.0, dpo_beta=0.1, pairs_per_step=2, heldout_pair_share=0.0)
        dpo = full.trace_replay.dpo_loss(model, pairs).item()
        full.trace_replay.config = plain
        assert full.trace_replay.dpo_loss(model, pairs).item() == pytest.approx(dpo, abs=1e-5)
        full.trace_replay.config = plain.model_copy(update={"pair_tokens": "disagreement", "shared_weight": 0.0})
        only = full.trace_replay.dpo_loss(model, pairs).item()
        chosen_tok, rejected_tok = full.trace_replay.pair_logps(model, pairs, per_token=True)
    margins = []
    for i, pair in enumerate(pairs):
        limit = full.max_completion_length
        w_c, w_r = disagreement_weights(cap_response(pair.chosen_ids, limit), cap_response(pair.rejected_ids, limit), 0.0)
        policy = (sum(w * v for w, v in zip(w_c, chosen_tok[i].tolist(), strict=False))
                  - sum(w * v for w, v in zip(w_r, rejected_tok[i].tolist(), strict=False)))
        reference = (sum(w * v for w, v in zip(w_c, pair.ref_chosen_token_logps, strict=True))
                     - sum(w * v for w, v in zip(w_r, pair.ref_rejected_token_logps, strict=True)))
        margins.append(policy - reference)
    expected = sum(-torch.nn.functional.logsigmoid(torch.tensor(0.1 * m)).item() for m in margins) / len(margins)
    assert only == pytest.approx(expected, abs=1e-5)
    assert abs(only - dpo) > 1e-4  # the shared text moved the plain margin


def test_the_shared_text_s_log_probs_never_enter_the_loss_and_steps_widen_the_margin(model_and_tokenizer,
                                                                                     tmp_path) -> None:
    """With ``shared_weight`` 0 the loss does not depend on the shared tokens' log-probs (moving
    their stored references changes nothing; moving a disagreeing token's does), and a few steps
    on the pair widen the margin it is taken over. (Whether the shared text's own log-probs then
    fall less than under plain DPO is an empirical question for the validation runs, not a
    property: in this toy they fell as much, through the parameters the two sides share.)"""
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, pair_tokens="disagreement")
    replay = trainer.trace_replay
    pair = _pair(tokenizer, CHOSEN, REJECTED, "a")
    replay._set_token_references([pair])
    _, w_r = disagreement_weights(pair.chosen_ids, pair.rejected_ids, 0.0)
    first = w_r.index(1.0)
    shared = [j for j, w in enumerate(w_r) if w == 0.0 and j > first]
    assert len(shared) >= 5  # the pair shares text after its first difference
    with torch.no_grad():
        before = replay.dpo_loss(model, [pair]).item()
        moved = pair.model_copy(deep=True)
        for j in shared:
            moved.ref_rejected_token_logps[j] -= 3.0
        assert replay.dpo_loss(model, [moved]).item() == pytest.approx(before, abs=1e-6)
        moved.ref_rejected_token_logps[first] -= 3.0
        assert abs(replay.dpo_loss(model, [moved]).item() - before) > 1e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(4):
        optimizer.zero_grad()
        replay.dpo_loss(model, [pair]).backward()
        optimizer.step()
    with torch.no_grad():
        replay.dpo_loss(model, [pair])
    assert replay._pending_metrics["replay/margin"] > 1.0  # 9.7 here (1 and 2 threads): far from the bar
    assert set(replay._pending_metrics) == {"replay/chosen_logp", "replay/rejected_logp", "replay/margin",
                                            "replay/disagreement_share"}


def test_per_token_log_probs_agree_between_the_shared_context_and_one_row_per_side(model_and_tokenizer,
                                                                                      tmp_path) -> None:
    """The path taken under activation checkpointing (one ``context + response`` row per side)
    gives the same per-token log-probs, at the same columns, as the shared-context path, and
    they sum to the summed log-probs."""
    from trainer_client.losses.trace_replay import replay_pair_logps

    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path)
    pairs = [_pair(tokenizer, CHOSEN, REJECTED, "a"), _pair(tokenizer, r"So \boxed{43}", r"It is \boxed{33}", "b")]
    kwargs = {"pad_token_id": tokenizer.pad_token_id, "max_completion_length": trainer.max_completion_length,
              "device": "cpu"}
    with torch.no_grad():
        shared = replay_pair_logps(model, pairs, per_token=True, **kwargs)
        rows = replay_pair_logps(model, pairs, per_token=True, shared_context=False, **kwargs)
        summed = replay_pair_logps(model, pairs, **kwargs)
    for a, b, s in zip(shared, rows, summed, strict=True):
        assert a.shape == (2, trainer.max_completion_length)
        assert torch.allclose(a, b, atol=1e-5)
        assert torch.allclose(a.sum(-1), s, atol=1e-4)
    assert (shared[0][1, len(pairs[1].chosen_ids):] == 0).all()  # 0 past a side's end
