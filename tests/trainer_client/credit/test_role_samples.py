"""Role-to-turn mapping: samples from graded records, write-back, group normalisation, tensors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from records import make_record, per_role_normalize

from env_server.protocol.markers import Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward
from trainer_client.credit.pipeline import token_tensors
from trainer_client.credit.role_samples import (
    announce_strategy,
    build_role_samples,
    resolve_sample_values,
    shape_samples,
    turn_values,
)
from trainer_client.credit.shaping import get_strategy
from trainer_client.rollout.segments import Segment

# --------------------------------------------------------------------------- samples


def test_build_role_items_flattens_rollouts_by_role():
    one_round = make_record([True], [True], True, "a")                      # S V J
    three_rounds = make_record([False, False, True], [False, False, True], None, "b")  # (S V)x3 J
    samples = build_role_samples([one_round, three_rounds], group_ids=[7, 7])
    assert samples.index == ((0, Role.SOLVER), (0, Role.VERIFIER), (0, Role.JUDGE),
                           (1, Role.SOLVER), (1, Role.VERIFIER), (1, Role.JUDGE))
    assert samples.roles == (Role.SOLVER, Role.VERIFIER, Role.JUDGE) * 2
    assert all(type(role) is Role for role in samples.roles)
    assert samples.rewards.dtype == np.float32
    np.testing.assert_array_equal(samples.rewards, [1, 1, 1, 1, 1, 1])
    assert list(samples.group_ids) == [7] * 6
    assert samples.batch.facts is not None and samples.batch.facts[3] is three_rounds.facts
    assert samples.batch.turns is not None and samples.batch.turns[4] is three_rounds.turns
    assert samples.turn_roles[1] == (Role.SOLVER, Role.VERIFIER) * 3 + (Role.JUDGE,)


def test_build_role_items_role_subset_and_order():
    samples = build_role_samples([make_record([False], [False], False)], [0], roles=["verifier", Role.SOLVER])
    assert samples.roles == (Role.VERIFIER, Role.SOLVER)
    np.testing.assert_array_equal(samples.rewards, [0, 0])


def test_build_role_items_rejects_ungraded_and_bad_input():
    rec = make_record([True], [True], True)
    with pytest.raises(ValueError, match=r"rollouts \[1\] have no rewards record"):
        build_role_samples([rec, None], [0, 0])
    with pytest.raises(ValueError, match="group ids"):
        build_role_samples([rec], [0, 1])
    shuffled = rec.model_copy(update={"turns": list(reversed(rec.turns))})
    with pytest.raises(ValueError, match="numbered"):
        build_role_samples([shuffled], [0])


# --------------------------------------------------------------------------- write-back


LABELS = ("solver", "verifier", "judge", "solver")


def test_resolve_per_role_dict_missing_role_keeps_raw_and_judge_is_zero():
    raw = np.array([1.0, 1.0, 1.0, 0.5], dtype=np.float32)
    shaped = {"solver": np.array([10, 20, 30, 40.0]), Role.JUDGE: np.array([9, 9, 9, 9.0])}
    out = resolve_sample_values(shaped, raw, LABELS)
    np.testing.assert_array_equal(out, [10, 1, 0, 40])    # verifier: raw (no key); judge: 0
    assert out.dtype == np.float32
    np.testing.assert_array_equal(raw, [1, 1, 1, 0.5])    # input untouched


def test_resolve_global_array_indexed_directly():
    raw = np.zeros(4, dtype=np.float64)
    out = resolve_sample_values(np.array([1, 2, 3, 4], dtype=np.float32), raw, LABELS)
    np.testing.assert_array_equal(out, [1, 2, 0, 4])
    assert out.dtype == np.float64


def test_resolve_rejects_bad_shapes_and_non_finite():
    raw = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="shape"):
        resolve_sample_values(np.zeros(3), raw, LABELS)
    with pytest.raises(ValueError, match="shape"):
        resolve_sample_values({"solver": np.zeros(2)}, raw, LABELS)
    with pytest.raises(ValueError, match="non-finite"):
        resolve_sample_values({"verifier": np.array([0, np.nan, 0, 0])}, raw, LABELS)


def test_shape_items_runs_strategy_and_writes_back():
    # verifier turned a wrong first answer into a right final one: difference reward 1 - 0
    records = [make_record([False, True], [False, True], True), make_record([True], [False], False)]
    samples = build_role_samples(records, [0, 0])
    out = shape_samples(get_strategy("difference_rewards"), samples)
    # samples: (0,S) (0,V) (0,J) (1,S) (1,V) (1,J); G = 1, 1, 1, 0, 0, 0
    np.testing.assert_array_equal(out, [1, 1, 0, 0, -1, 0])
    assert out.dtype == np.float32


# --------------------------------------------------------------------------- group normalisation


def test_group_normalize_matches_trl_formula_per_role():
    values = np.array([1, 0, 1, 1, 0.5, 0.5], dtype=np.float32)
    labels = ["solver", "solver", "solver", "verifier", "verifier", "verifier"]
    out = per_role_normalize(values, labels, [0] * 6)
    solver = torch.tensor([1.0, 0.0, 1.0])
    expected = (solver - solver.mean()) / (solver.std() + 1e-4)  # torch.std is Bessel-corrected, like TRL
    np.testing.assert_allclose(out[:3], expected.numpy(), rtol=1e-6)
    verifier = np.array([1, 0.5, 0.5])
    np.testing.assert_allclose(out[3:], (verifier - verifier.mean()) / (verifier.std(ddof=1) + 1e-4), rtol=1e-6)
    assert out.dtype == np.float32
    np.testing.assert_allclose(per_role_normalize(values, labels, [0] * 6, scale=False)[:3], [1 / 3, -2 / 3, 1 / 3],
                               rtol=1e-6)


def test_group_normalize_separates_groups_and_zero_std_groups_get_zero():
    values = np.array([1, 0, 1, 1, 1], dtype=np.float64)
    out = per_role_normalize(values, ["solver"] * 5, [0, 0, 1, 1, 2])
    np.testing.assert_allclose(out[:2], [0.5 / (np.sqrt(0.5) + 1e-4), -0.5 / (np.sqrt(0.5) + 1e-4)])
    np.testing.assert_array_equal(out[2:], [0, 0, 0])  # zero-std group and a one-sample group


def test_judge_zero_never_enters_a_group_mean():
    """The known pitfall: judge samples (reward 0) must not pull the solver's group mean down."""
    solver_only = per_role_normalize(np.array([1.0, 1.0, 0.0, 1.0]), ["solver"] * 4, [0] * 4)
    with_judges = per_role_normalize(
        np.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
        ["solver", "judge"] * 4, [0] * 8,
    )
    np.testing.assert_allclose(with_judges[0::2], solver_only)
    np.testing.assert_array_equal(with_judges[1::2], 0.0)
    # and the same through the whole path from records: judge samples carry raw G=1 here
    records = [make_record([True], [True], True), make_record([False], [False], False)]
    samples = build_role_samples(records, [0, 0], roles=[Role.SOLVER, Role.JUDGE])
    adv = per_role_normalize(shape_samples(get_strategy("identity"), samples), samples.roles, samples.group_ids)
    np.testing.assert_allclose(adv, [0.5 / (np.sqrt(0.5) + 1e-4), 0, -0.5 / (np.sqrt(0.5) + 1e-4), 0], rtol=1e-6)


def test_group_normalize_rejects_length_mismatch():
    with pytest.raises(ValueError):
        per_role_normalize(np.zeros(3), ["solver"] * 2, [0] * 3)


# --------------------------------------------------------------------------- per-turn values


def test_turn_values_uniform_per_role_single_and_multi_round():
    records = [make_record([True], [True], True), make_record([False, False, True], [False, False, True], True)]
    samples = build_role_samples(records, [0, 0])
    values = np.array([0.25, -0.5, 9.0, 0.75, 1.5, 9.0], dtype=np.float32)  # judge values must not leak
    per_turn = turn_values(samples, values)
    np.testing.assert_array_equal(per_turn[0], [0.25, -0.5, 0.0])
    np.testing.assert_array_equal(per_turn[1], [0.75, 1.5] * 3 + [0.0])
    assert per_turn[1].dtype == np.float32


def test_turn_values_judge_without_items_is_zero_other_roles_must_have_items():
    rec = make_record([True], [False], True)
    samples = build_role_samples([rec], [0], roles=[Role.SOLVER, Role.VERIFIER])
    np.testing.assert_array_equal(turn_values(samples, np.array([2.0, 3.0]))[0], [2, 3, 0])
    solver_only = build_role_samples([rec], [0], roles=[Role.SOLVER])
    with pytest.raises(ValueError, match="no sample for role 'verifier'"):
        turn_values(solver_only, np.array([2.0]))
    with pytest.raises(ValueError, match="shape"):
        turn_values(samples, np.array([2.0]))


# --------------------------------------------------------------------------- token tensors


def segs(*triples: tuple[int, str, int, int]) -> list[Segment]:
    return [Segment.of(turn=t, role=r, start=s, end=e) for t, r, s, e in triples]


def test_token_tensors_fill_spans_and_mask_judge_padding_and_gaps():
    rows = [
        segs((0, "solver", 0, 3), (1, "verifier", 4, 6), (2, "judge", 6, 8)),  # token 3 is a gap
        segs((0, "solver", 0, 2), (1, "verifier", 2, 3), (2, "solver", 3, 5), (3, "verifier", 5, 6),
              (4, "judge", 6, 7)),
    ]
    per_turn = [[0.5, -1.0, 7.0], np.array([2.0, 3.0, 2.0, 3.0, 7.0])]
    values, mask = token_tensors(rows, per_turn, T=10)
    assert values.dtype == torch.float32 and mask.dtype == torch.bool
    assert values.shape == mask.shape == (2, 10)
    torch.testing.assert_close(values[0], torch.tensor([0.5, 0.5, 0.5, 0, -1, -1, 0, 0, 0, 0]))
    assert mask[0].tolist() == [True] * 3 + [False] + [True] * 2 + [False] * 4
    torch.testing.assert_close(values[1], torch.tensor([2, 2, 3, 2, 2, 3, 0, 0, 0, 0.0]))
    assert mask[1].tolist() == [True] * 6 + [False] * 4


def test_token_tensors_validation():
    with pytest.raises(ValueError, match="past T"):
        token_tensors([segs((0, "solver", 0, 5))], [[1.0]], T=4)
    with pytest.raises(ValueError, match="overlaps"):
        token_tensors([segs((0, "solver", 0, 3), (1, "verifier", 2, 4))], [[1.0, 1.0]], T=4)
    with pytest.raises(ValueError, match="no value"):
        token_tensors([segs((1, "verifier", 0, 2))], [[1.0]], T=4)
    with pytest.raises(ValueError, match="rows"):
        token_tensors([segs((0, "solver", 0, 2))], [], T=4)


def test_segment_validation():
    assert Segment.of(turn=0, role="judge", start=1, end=1).role is Role.JUDGE
    with pytest.raises(ValueError):
        Segment.of(turn=0, role="solver", start=3, end=2)
    with pytest.raises(ValueError):
        Segment.of(turn=-1, role="solver", start=0, end=2)
    with pytest.raises(ValueError):
        Segment.of(turn=0, role="critic", start=0, end=2)


def test_role_mapping_imports_without_torch():
    code = "import sys, trainer_client.credit.role_samples; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


class _Broken(get_strategy("identity").__class__):
    """A strategy whose shaping raises (a user's bug)."""

    name = "broken_for_test"

    def shape(self, batch):
        raise RuntimeError("boom")


def test_a_strategy_that_raises_falls_back_to_raw_rewards_with_a_warning(caplog) -> None:
    records = [make_record([True], [True], True, "a"), make_record([False], [False], None, "b")]
    samples = build_role_samples(records, [0, 0])
    raw = shape_samples(get_strategy("identity"), samples)
    with caplog.at_level("WARNING", logger="trainer_client.credit.role_samples"):
        shaped = shape_samples(_Broken(), samples)
    np.testing.assert_array_equal(shaped, raw)  # the batch goes on with the raw rewards
    assert any("broken_for_test" in r.getMessage() and "boom" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)


def test_the_active_non_identity_strategy_is_named_once_at_info(caplog) -> None:
    with caplog.at_level("INFO", logger="trainer_client.credit.role_samples"):
        announce_strategy(get_strategy("identity"))
        assert not caplog.records  # identity is the default: nothing to announce
        announce_strategy(get_strategy("reward_mixing", alpha=0.3))
    lines = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(lines) == 1 and "reward_mixing" in lines[0] and "0.3" in lines[0]


def _single_turn_record(correct: bool, episode_id: str) -> EpisodeRewards:
    """A graded single-turn episode: the solver answers once and that answer is the outcome."""
    facts = CounterfactualFacts(
        first_answer_correct=correct, last_solver_answer_correct=correct, final_answer_correct=correct,
        judge_correct=None, verifier_accepted=False, rounds=1,
        local_rewards={Role.SOLVER: float(correct)}, rewards_without_role={Role.SOLVER: 0.0})
    return EpisodeRewards(episode_id=episode_id, problem_id="p", episode_reward=float(correct), graded_at=0.0,
                          facts=facts, turns=[TurnReward(t=0, role=Role.SOLVER, reward=float(correct),
                                                         correct=correct, answer="1")])


@pytest.mark.parametrize("scale", [True, False])
def test_identity_advantages_equal_trl_grpo_advantages_on_a_single_turn_batch(scale: bool) -> None:
    """With identity shaping and no extra channel, the record -> (B, T) path gives every token
    of a rollout TRL 1.16 GRPOTrainer's advantage for that rollout (its lines, with its own
    ``nanstd``: group mean, Bessel-corrected group std, ``+ 1e-4``)."""
    from trl.trainer.utils import nanstd  # TRL's own std (unbiased), as GRPOTrainer uses it

    num_generations, T = 4, 6
    outcomes = [True, False, False, True, True, True, True, True, False, False, False, True]
    records = [_single_turn_record(ok, f"e{i}") for i, ok in enumerate(outcomes)]
    group_ids = [i // num_generations for i in range(len(records))]

    # ours: the trainer's one reward-to-loss path (records -> samples -> identity shaping ->
    # per-role group normalisation -> tokens), for the whole batch on one process
    from trainer_client.credit.pipeline import batch_advantages
    from trainer_client.rollout.segments import Segment, SegmentOwner

    segments = [[Segment(1, T, SegmentOwner(0, Role.SOLVER, True))] for _ in records]
    result = batch_advantages(records, num_generations, get_strategy("identity"), segments, T, 0, scale=scale)
    values, mask = result.advantages, result.loss_mask
    assert len(group_ids) == len(records)

    # TRL 1.16 GRPOTrainer._generate_and_score_completions, scale_rewards="group" (or "none")
    rewards = torch.tensor([r.episode_reward for r in records])
    mean_grouped = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    std_grouped = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    trl = rewards - mean_grouped
    if scale:
        trl = trl / (std_grouped + 1e-4)

    assert mask[:, 1:].all() and not mask[:, 0].any()
    torch.testing.assert_close(values[:, 1:], trl.unsqueeze(1).expand(-1, T - 1).to(values.dtype))
    assert trl.abs().sum() > 0  # a batch with signal, so equality is not 0 == 0
