"""Trace replay whose pairs are learned (issue 56, item 3), on the real tiny model and a real
trainer: TR-DPO's following reference (``replay.ref_model_sync_steps``,
``replay.ref_model_mixup_alpha``; TRL's ``SyncRefModelCallback.sync_target_model``) and the
pairs' references recomputed after a sync, ``replay.draws_per_pair``, pairs from the policy's own
GRPO group (``replay.pair_source``), each objective logged apart, the held-out
``margin_above_start`` by hand, and the settings refused at load."""

from __future__ import annotations

import copy
import math
import os
import random
from collections import Counter

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset
from pydantic import ValidationError
from trainer_batches import make_trainer, zero_reward
from trl import GRPOConfig

from env_server.protocol.markers import Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward
from trainer_client.config import ReplayConfig, config_error_line, load_config
from trainer_client.losses.base import LossContext, ScoredBatch
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.losses.teachers import TeacherPool
from trainer_client.rollout.segments import Segment
from trainer_client.trainer import DebateGRPOTrainer
from trainer_client.trl_compat import checkpointing_off, restore_class_forward

QUESTION = [{"role": "user", "content": "What is 16 plus 27?"}]
SIDES = [(r"13, carry 1: \boxed{43}", r"13, carry 0: \boxed{33}"), (r"So \boxed{43}", r"So \boxed{33}"),
         (r"It is \boxed{43}.", r"It is \boxed{42}.")]


def _pair(tokenizer, chosen: str, rejected: str, name: str) -> DpoPair:
    context = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False)
    chosen_ids, rejected_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                                for text in (chosen, rejected))
    return DpoPair(prompt_messages=QUESTION, chosen=chosen, rejected=rejected, episode_id=name, t=0, role="solver",
                   teacher="t", created_step=0, context_ids=list(context), chosen_ids=chosen_ids,
                   rejected_ids=rejected_ids)


def _trainer(model_and_tokenizer, tmp_path, teacher_pool=None, **replay):
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    restore_class_forward(model)  # an earlier trainer patched the shared model's forward
    model.eval()  # no dropout: log-probs are functions of the weights alone
    config = ReplayConfig(**{"beta": 1.0, "dpo_beta": 0.1, "pairs_per_step": 2, "heldout_pair_share": 0.0, **replay})
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, replay=config,
                           teacher_pool=object() if teacher_pool is None else teacher_pool,
                           pair_store=PairStore(tmp_path / "pairs.jsonl"))
    return model, tokenizer, trainer


def _move(model: torch.nn.Module, seed: int, scale: float = 0.02) -> None:
    """Move every parameter of ``model`` away from where it is (a stand-in for GRPO's steps)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def _step_end(trainer, step: int) -> None:
    """The end of optimizer step ``step`` as transformers signals it to the replay's callback."""
    trainer.state.global_step = step
    trainer.trace_replay.sync_callback.on_step_end(trainer.args, trainer.state, trainer.control, model=trainer.model)


# ---------------------------------------------------------------------------- the reference that follows the policy


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_the_reference_is_mixed_towards_the_policy_every_sync_steps(model_and_tokenizer, tmp_path, alpha) -> None:
    model, _, trainer = _trainer(model_and_tokenizer, tmp_path, ref_model_sync_steps=2, ref_model_mixup_alpha=alpha)
    replay = trainer.trace_replay
    assert replay.sync_callback in trainer.callback_handler.callbacks
    reference, start = replay._following, replay._initial_policy
    assert reference is not None and start is not None and reference is not start
    initial = [p.detach().clone() for p in model.parameters()]
    _move(model, seed=1)
    old = [p.detach().clone() for p in reference.parameters()]
    policy = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(o, p) for o, p in zip(old, policy, strict=True))

    _step_end(trainer, 1)  # before ref_model_sync_steps steps: nothing moves
    assert replay._syncs == 0
    for r, o in zip(reference.parameters(), old, strict=True):
        assert torch.equal(r, o)

    _step_end(trainer, 2)
    assert replay._syncs == 1
    for r, o, p in zip(reference.parameters(), old, policy, strict=True):
        torch.testing.assert_close(r.detach(), alpha * p + (1 - alpha) * o, rtol=0, atol=1e-6)
        if alpha == 1.0:
            torch.testing.assert_close(r.detach(), p, rtol=0, atol=1e-6)
    _step_end(trainer, 3)  # not a multiple of 2
    assert replay._syncs == 1
    # the start policy stays the step-0 weights (margin_above_start reads it)
    for s, i in zip(start.parameters(), initial, strict=True):
        assert torch.equal(s, i)
    for p, q in zip(model.parameters(), policy, strict=True):
        assert torch.equal(p, q)  # the sync never touches the policy


@pytest.mark.parametrize("pair_tokens", ["all", "disagreement"])
def test_a_drawn_pair_s_references_are_the_new_reference_s_after_a_sync(model_and_tokenizer, tmp_path,
                                                                         pair_tokens) -> None:
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, ref_model_sync_steps=1, pairs_per_step=1,
                                         pair_tokens=pair_tokens)
    replay = trainer.trace_replay
    pair = _pair(tokenizer, *SIDES[0], "a")
    replay._set_references([pair])  # as a stored pair gets them: under the reference, before any sync
    replay.pair_store.add([pair])
    with torch.no_grad():
        start_chosen, start_rejected = replay.pair_logps(replay._initial_policy, [pair])
    assert pair.ref_sync == 0
    assert (pair.ref_chosen_logp, pair.ref_rejected_logp) == pytest.approx(
        (start_chosen.item(), start_rejected.item()), abs=1e-5)

    _move(model, seed=2)
    _step_end(trainer, 1)
    assert replay._syncs == 1
    (drawn,) = replay._draw(2)
    assert drawn is pair and pair.ref_sync == 1
    with torch.no_grad():
        fresh_chosen, fresh_rejected = replay.pair_logps(replay._following, [pair])
        fresh_tokens = replay.pair_logps(replay._following, [pair], per_token=True)
    assert (pair.ref_chosen_logp, pair.ref_rejected_logp) == pytest.approx(
        (fresh_chosen.item(), fresh_rejected.item()), abs=1e-5)
    assert abs(pair.ref_chosen_logp - start_chosen.item()) > 1e-3  # they did move
    assert pair._start_logps == pytest.approx((start_chosen.item(), start_rejected.item()), abs=1e-5)  # kept
    if pair_tokens == "disagreement":
        n_c, n_r = len(pair.ref_chosen_token_logps), len(pair.ref_rejected_token_logps)
        assert pair.ref_chosen_token_logps == pytest.approx(fresh_tokens[0][0, :n_c].tolist(), abs=1e-5)
        assert pair.ref_rejected_token_logps == pytest.approx(fresh_tokens[1][0, :n_r].tolist(), abs=1e-5)
    # drawn again without a sync in between: not recomputed
    pair.ref_chosen_logp += 1.0
    replay._draw(3)
    assert pair.ref_chosen_logp == pytest.approx(fresh_chosen.item() + 1.0, abs=1e-5)


def test_after_a_hard_sync_the_margin_is_zero_and_the_loss_log_2(model_and_tokenizer, tmp_path) -> None:
    """α = 1: the reference is the policy, so every drawn pair's DPO margin is 0 (the margin is
    taken against the reference of the moment, not the one the pair was stored with)."""
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0)
    replay = trainer.trace_replay
    pairs = [_pair(tokenizer, *SIDES[0], "a"), _pair(tokenizer, *SIDES[1], "b")]
    replay._set_references(pairs)
    replay.pair_store.add(pairs)
    _move(model, seed=3)
    with torch.no_grad():
        assert abs(replay.dpo_loss(model, pairs).item() - math.log(2)) > 1e-3  # stale references: not log 2
    _step_end(trainer, 1)
    drawn = replay._draw(2)
    assert sorted(p.episode_id for p in drawn) == ["a", "b"]
    with torch.no_grad():
        assert replay.dpo_loss(model, drawn).item() == pytest.approx(math.log(2), abs=1e-5)


def test_the_following_reference_survives_a_checkpoint(model_and_tokenizer, tmp_path) -> None:
    model, _, trainer = _trainer(model_and_tokenizer, tmp_path, teacher_pool=TeacherPool([], equivalent=str.__eq__),
                                 ref_model_sync_steps=1)
    replay = trainer.trace_replay
    _move(model, seed=4)
    _step_end(trainer, 1)
    state = replay.state_dict()
    assert state["ref_syncs"] == 1 and state["reference"].endswith("checkpoint-1/mathdebate/replay_reference.pt")
    _, _, resumed = _trainer(model_and_tokenizer, tmp_path / "resumed",
                             teacher_pool=TeacherPool([], equivalent=str.__eq__), ref_model_sync_steps=1)
    resumed.trace_replay.pair_store = replay.pair_store
    resumed.trace_replay.load_state_dict(state)
    assert resumed.trace_replay._syncs == 1
    for a, b in zip(resumed.trace_replay._following.parameters(), replay._following.parameters(), strict=True):
        assert torch.equal(a, b)
    for pool in (replay.teacher_pool, resumed.trace_replay.teacher_pool):
        pool.close()


# ---------------------------------------------------------------------------- draws per pair


def test_each_pair_is_drawn_draws_per_pair_times_and_the_counts_survive_a_checkpoint(model_and_tokenizer,
                                                                                      tmp_path) -> None:
    _, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, teacher_pool=TeacherPool([], equivalent=str.__eq__),
                                     draws_per_pair=2, pairs_per_step=2)
    replay, store = trainer.trace_replay, trainer.trace_replay.pair_store
    pairs = [_pair(tokenizer, chosen, rejected, name) for (chosen, rejected), name in zip(SIDES, "abc", strict=True)]
    replay._set_references(pairs)
    store.add(pairs)

    first = [p.episode_id for p in replay._draw(1)]
    assert len(set(first)) == 2
    state = replay.state_dict()  # a checkpoint after step 1
    assert state["pair_store"]["draws"] == sorted([[ord(name) - ord("a"), 1] for name in first])
    later = [[p.episode_id for p in replay._draw(step)] for step in (2, 3)]
    (unseen,) = set("abc") - set(first)
    assert unseen in later[0]  # the least drawn first
    counts = Counter(first + later[0] + later[1])
    assert counts == {"a": 2, "b": 2, "c": 2} and all(len(set(d)) == 2 for d in later)
    assert replay._draw(4) == [] and replay._draw(5) == []  # every pair retired
    assert store.draw_counts() == {0: 2, 1: 2, 2: 2}

    # a resumed run: the file reopened, the checkpoint's counts and stream put back
    _, _, resumed = _trainer(model_and_tokenizer, tmp_path / "resumed",
                             teacher_pool=TeacherPool([], equivalent=str.__eq__), draws_per_pair=2, pairs_per_step=2)
    again = resumed.trace_replay
    again.pair_store = PairStore(tmp_path / "pairs.jsonl")
    again.load_state_dict(state)
    assert again.pair_store.draw_counts() == {ord(name) - ord("a"): 1 for name in first}
    assert [[p.episode_id for p in again._draw(step)] for step in (2, 3)] == later
    assert again._draw(4) == []
    for pool in (replay.teacher_pool, again.teacher_pool):
        pool.close()


# ---------------------------------------------------------------------------- pairs from the policy's own group


def _group_trainer(model_and_tokenizer, tmp_path, **replay):
    """A trainer whose generation batch is two groups of four rollouts (``num_generations`` 4)."""
    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    restore_class_forward(model)
    model.eval()
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=32, report_to=[], save_strategy="no",
                      **checkpointing_off(GRPOConfig))
    config = ReplayConfig(**{"beta": 1.0, "pair_source": "group", "heldout_pair_share": 0.0, **replay})
    trainer = DebateGRPOTrainer(model=model, reward_funcs=[zero_reward], args=args, processing_class=tokenizer,
                                train_dataset=Dataset.from_list([{"prompt": QUESTION}] * 8), replay=config,
                                teacher_pool=None, pair_store=PairStore(tmp_path / "pairs.jsonl"))
    return model, tokenizer, trainer


def _record(episode: str, rewards: list[float]) -> EpisodeRewards:
    facts = CounterfactualFacts(first_answer_correct=bool(rewards[0]), last_solver_answer_correct=bool(rewards[0]),
                                final_answer_correct=bool(rewards[0]), judge_correct=None, verifier_accepted=True,
                                rounds=1, local_rewards={}, rewards_without_role={}, circular_critique=False)
    turns = [TurnReward(t=0, role=Role.SOLVER, reward=rewards[0], correct=bool(rewards[0])),
             TurnReward(t=1, role=Role.VERIFIER, reward=rewards[1], correct=bool(rewards[1]))]
    return EpisodeRewards(episode_id=episode, problem_id="p", turns=turns, episode_reward=rewards[0], facts=facts,
                          graded_at=0.0)


def test_group_pairs_pair_a_right_first_turn_with_a_wrong_one_on_the_shared_prompt(model_and_tokenizer,
                                                                                  tmp_path) -> None:
    model, tokenizer, trainer = _group_trainer(model_and_tokenizer, tmp_path, roles=[Role.SOLVER, Role.VERIFIER])
    replay = trainer.trace_replay
    pad = tokenizer.pad_token_id
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
               for text in ("What is 16 plus 27?", "What is 6 times 7? Answer in a box.")]
    assert len(prompts[0]) != len(prompts[1])  # one of them is left-padded in the batch
    width = max(map(len, prompts))
    solver = [tokenizer(rf"It is \boxed{{{n}}}.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
              for n in (43, 33, 44, 43, 42, 42, 42, 42)]
    tool = tokenizer("<tool_response>ok</tool_response>", add_special_tokens=False)["input_ids"]
    verdict = [tokenizer(f"VERDICT: {v}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for v in ("CORRECT", "CORRECT", "INCORRECT", "INCORRECT") * 2]
    completions = [s + tool + v for s, v in zip(solver, verdict, strict=True)]
    length = max(map(len, completions))
    group_of = [0, 0, 0, 0, 1, 1, 1, 1]
    output = {
        "prompt_ids": torch.tensor([[pad] * (width - len(prompts[g])) + prompts[g] for g in group_of]),
        "prompt_mask": torch.tensor([[0] * (width - len(prompts[g])) + [1] * len(prompts[g]) for g in group_of]),
        "completion_ids": torch.tensor([c + [pad] * (length - len(c)) for c in completions]),
    }
    segments = [[Segment.of(0, Role.SOLVER, 0, len(s)),
                 Segment.of(1, Role.VERIFIER, len(s) + len(tool), len(s) + len(tool) + len(v))]
                for s, v in zip(solver, verdict, strict=True)]
    # group 0: solver rewards [1, 0, 0, 1]: rows 0 (right) and 1 (wrong) pair. Its verifiers' first
    # turns share a context only where the solver wrote the same tokens (rows 0 and 3, both "43"):
    # row 0's right verdict pairs with row 3's wrong one; rows 1 and 2 review other answers, alone.
    # group 1: every solver wrong, every verifier right (all-equal rewards): no pair
    solver_rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    verifier_rewards = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    records = [_record(f"e{k}", [s, v]) for k, (s, v) in enumerate(zip(solver_rewards, verifier_rewards, strict=True))]
    trainer.state.global_step = 3
    replay.prepare(ScoredBatch(output, records, [None] * 8, segments, [], "train", 3))
    assert replay.batch_metrics()["replay/group_pairs"] == 2.0

    stored = {p.role: p for p in PairStore(tmp_path / "pairs.jsonl").sample(10, random.Random(0))}  # from the file
    assert sorted(stored) == [Role.SOLVER, Role.VERIFIER]
    pair = stored[Role.SOLVER]
    assert pair.source == "group" and pair.t == 0 and pair.created_step == 3
    assert pair.context_ids == prompts[0]  # the shared prompt, padding dropped
    assert pair.chosen_ids == solver[0] and pair.rejected_ids == solver[1]  # first right row, first wrong row
    assert pair.teacher == "group:e0" and pair.episode_id == "e1" and not pair.gold_supervised
    assert pair.chosen == tokenizer.decode(solver[0]) and pair.prompt_messages == []
    verifier = stored[Role.VERIFIER]
    assert verifier.source == "group" and verifier.t == 1 and verifier.context_ids == prompts[0] + solver[0] + tool
    assert verifier.chosen_ids == verdict[0] and verifier.rejected_ids == verdict[3]
    assert verifier.teacher == "group:e0" and verifier.episode_id == "e3"
    with torch.no_grad():
        chosen, rejected = replay.pair_logps(model, [pair, verifier])  # the policy is the start policy still
    assert [p.ref_chosen_logp for p in (pair, verifier)] == pytest.approx(chosen.tolist(), abs=1e-5)
    assert [p.ref_rejected_logp for p in (pair, verifier)] == pytest.approx(rejected.tolist(), abs=1e-5)

    # eval batches build none; an all-right (or all-wrong) group gives none
    replay.prepare(ScoredBatch(output, records, [None] * 8, segments, [], "eval", 3))
    equal = [_record(f"f{k}", [1.0, 1.0]) for k in range(8)]
    replay.prepare(ScoredBatch(output, equal, [None] * 8, segments, [], "train", 4))
    assert replay.batch_metrics()["replay/group_pairs"] == 0.0
    assert len(replay.pair_store) == 2


# ---------------------------------------------------------------------------- each objective in the metrics


def test_the_dpo_term_and_rpo_s_nll_are_logged_apart(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, rpo_alpha=0.5, pairs_per_step=2)
    replay = trainer.trace_replay
    pairs = [_pair(tokenizer, *SIDES[0], "a"), _pair(tokenizer, *SIDES[1], "b")]
    replay._set_references(pairs)
    for pair, offset in zip(pairs, (1.0, -2.0), strict=True):
        pair.ref_chosen_logp += offset  # margins of -1 and +2 nats
    replay.pair_store.add(pairs)
    value, metrics = replay.loss(model, {}, LossContext("train", 1, 0))
    with torch.no_grad():
        chosen, _ = replay.pair_logps(model, pairs)
    margins = [-1.0, 2.0]
    dpo = sum(-math.log(1 / (1 + math.exp(-0.1 * m))) for m in margins) / 2  # by hand: −log σ(β m)
    lengths = [len(p.chosen_ids) for p in pairs]
    nll = sum(-c / n for c, n in zip(chosen.tolist(), lengths, strict=True)) / 2
    assert metrics["loss/trace_replay_dpo"] == pytest.approx(dpo, abs=1e-4)
    assert metrics["loss/trace_replay_nll"] == pytest.approx(nll, rel=1e-5)
    assert value.item() == pytest.approx(dpo + 0.5 * nll, rel=1e-5)


def test_the_control_stores_and_monitors_pairs_but_adds_no_term(model_and_tokenizer, tmp_path) -> None:
    """``replay.train_pairs: false`` (the control arm): the same stored pairs that give a DPO
    term when trained give none, while the held-out monitor still reads them."""
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, train_pairs=False, heldout_pair_share=0.5)
    replay = trainer.trace_replay
    pairs = [_pair(tokenizer, chosen, rejected, name) for (chosen, rejected), name in zip(SIDES, "abc", strict=True)]
    replay._set_references(pairs)
    replay.pair_store.add(pairs * 4)
    assert replay.loss(model, {}, LossContext("train", 1, 0)) == (None, {})
    replay.config.train_pairs = True  # the same store, trained: a term
    value, metrics = replay.loss(model, {}, LossContext("train", 1, 0))
    assert value is not None and "loss/trace_replay_dpo" in metrics
    assert replay.monitor(model)["replay/heldout/pairs"] > 0


def test_margin_above_start_by_hand(model_and_tokenizer, tmp_path) -> None:
    """Three held-out pairs whose start margins are set by hand 1 nat below, 1 above and 2 below
    the policy's: 2 of 3 are above the start. After a hard sync (the reference is the policy)
    the accuracy against the reference drops to 0 while the share above the start stays 2/3;
    a pair stored after the sync gets its start log-probs from the frozen start policy."""
    model, tokenizer, trainer = _trainer(model_and_tokenizer, tmp_path, ref_model_sync_steps=1,
                                         ref_model_mixup_alpha=1.0, heldout_pair_share=0.999, monitor_pairs=64)
    replay = trainer.trace_replay
    pairs = [_pair(tokenizer, chosen, rejected, name) for (chosen, rejected), name in zip(SIDES, "abc", strict=True)]
    with torch.no_grad():
        chosen, rejected = replay.pair_logps(model, pairs)
    for pair, c, r, (dc, dr) in zip(pairs, chosen.tolist(), rejected.tolist(), [(-0.5, 0.5), (1.0, 0.0), (0.0, 2.0)],
                                    strict=True):
        pair.ref_chosen_logp, pair.ref_rejected_logp = c + dc, r + dr  # start margin = policy margin + dc − dr
    replay.pair_store.add(pairs)
    monitored = replay.monitor(model)
    assert monitored["replay/heldout/pairs"] == 3.0
    assert monitored["replay/heldout/margin_above_start"] == pytest.approx(2 / 3)
    assert monitored["replay/heldout/accuracy"] == pytest.approx(2 / 3)  # the reference is the start: the same test

    _step_end(trainer, 1)  # the reference becomes the policy
    monitored = replay.monitor(model)
    assert monitored["replay/heldout/accuracy"] == 0.0  # every margin against the reference is 0
    assert monitored["replay/heldout/margin_above_start"] == pytest.approx(2 / 3)

    _move(model, seed=5)
    _step_end(trainer, 2)  # the reference moves with the policy, away from the start
    late = _pair(tokenizer, r"The sum is \boxed{43}", r"The sum is \boxed{34}", "d")
    replay._set_references([late])
    assert late.ref_sync == 2
    (start_chosen,), (start_rejected,) = replay.start_logps([late])
    with torch.no_grad():
        expected = replay.pair_logps(replay._initial_policy, [late])
    assert (start_chosen, start_rejected) == pytest.approx((expected[0].item(), expected[1].item()), abs=1e-5)
    assert abs(start_chosen - late.ref_chosen_logp) > 1e-3  # not the reference's


# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize(("overrides", "message"), [
    ({"replay.ref_model_mixup_alpha": 1.5}, "replay.ref_model_mixup_alpha: Input should be less than or equal to 1"),
    ({"replay.ref_model_mixup_alpha": -0.1}, "replay.ref_model_mixup_alpha: Input should be greater than or equal to 0"),
    ({"replay.draws_per_pair": 0}, "replay.draws_per_pair: Input should be greater than or equal to 1"),
    ({"replay.ref_model_sync_steps": 0}, "replay.ref_model_sync_steps: Input should be greater than or equal to 1"),
    ({"replay.pair_source": "teacher"}, "replay.pair_source: Input should be 'teachers', 'group' or 'both'"),
    ({"model": "Qwen/Qwen3-0.6B", "replay.beta": 0.05}, "needs at least 2 teachers"),
    ({"replay.ref_model_sync_steps": 4, "policies.solver": {"adapter": "solver"}},
     "replay.ref_model_sync_steps (a reference that follows the policy) is wired for the shared policy only"),
])
def test_invalid_settings_are_refused_at_load_in_one_line(overrides, message) -> None:
    with pytest.raises(ValidationError) as raised:
        load_config(None, None, overrides)
    line = config_error_line(raised.value)
    assert message in line and "\n" not in line


def test_the_control_loads_without_a_preset_and_with_one() -> None:
    """``replay.train_pairs: false`` loads on its own (``mathdebate ablate`` loads its base config
    before each arm's preset sets ``replay.beta``) and with the replay preset."""
    assert not load_config(None, None, {"replay.train_pairs": False}).replay.train_pairs
    config = load_config(None, "replay", {"replay.train_pairs": False})
    assert config.replay.beta > 0 and not config.replay.train_pairs


def test_valid_settings_load() -> None:
    config = load_config(None, None, {"model": "Qwen/Qwen3-0.6B", "replay.beta": 0.05, "replay.pair_source": "group",
                                      "replay.ref_model_sync_steps": 8, "replay.ref_model_mixup_alpha": 1.0,
                                      "replay.draws_per_pair": 3, "replay.monitor_pairs": 64})
    replay = config.replay
    assert (replay.pair_source, replay.ref_model_sync_steps, replay.ref_model_mixup_alpha, replay.draws_per_pair,
            replay.monitor_pairs, replay.teachers) == ("group", 8, 1.0, 3, 64, [])
    defaults = ReplayConfig()
    assert (defaults.ref_model_sync_steps, defaults.ref_model_mixup_alpha, defaults.draws_per_pair,
            defaults.pair_source) == (None, 0.6, None, "teachers")
    # a tiny model's default teachers are added only where pairs need teachers
    assert load_config(None, None, {"replay.beta": 0.05, "replay.pair_source": "group"}).replay.teachers == []
    assert len(load_config(None, None, {"replay.beta": 0.05}).replay.teachers) >= 2


def test_the_reference_is_saved_in_our_checkpoint_state_folder() -> None:
    from trainer_client.losses.trace_replay import CHECKPOINT_STATE_DIR
    from trainer_client.training.checkpoints import RANK_DIR

    assert CHECKPOINT_STATE_DIR == RANK_DIR  # the loss layer may not import the training layer's constant
