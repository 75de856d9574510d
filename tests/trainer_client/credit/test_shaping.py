"""Reward shaping strategies, registry and config (numpy core)."""

from __future__ import annotations

import copy
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from records import per_role_normalize

from env_server.protocol.markers import ErrorKind, Role
from env_server.protocol.models import CounterfactualFacts, TurnReward
from trainer_client.credit.role_samples import resolve_sample_values
from trainer_client.credit.shaping import (
    NO_STRATEGY_MESSAGE,
    IdentityStrategy,
    RewardShapingConfig,
    RewardShapingStrategy,
    available_strategies,
    create_strategy_from_config,
    get_strategy,
    register_strategy,
    shaping_metrics,
)
from trainer_client.credit.shaping.base import VERIFIER_ACCEPT_PROB, ShapingBatch

BUILTIN = ("coma_advantage", "difference_rewards", "identity", "own_outcome", "potential_based", "reward_mixing")


def facts(first: bool, final: bool, local_solver: float = 0.0, local_verifier: float = 0.0) -> CounterfactualFacts:
    return CounterfactualFacts(
        first_answer_correct=first, last_solver_answer_correct=final, final_answer_correct=final,
        judge_correct=final, verifier_accepted=False, rounds=1,
        local_rewards={Role.SOLVER: local_solver, Role.VERIFIER: local_verifier, Role.JUDGE: float(final)},
        rewards_without_role={Role.SOLVER: 0.0, Role.VERIFIER: float(first), Role.JUDGE: float(final)},
    )


def readonly(a: np.ndarray) -> np.ndarray:
    """Shaping must never write into its input: a read-only array makes any attempt raise."""
    a = a.copy()
    a.flags.writeable = False
    return a


def mixed_batch(dtype=np.float32):
    """Two debates of one prompt, flattened to (rollout, role) samples."""
    f0 = facts(first=False, final=True, local_solver=0.5, local_verifier=1.0)   # verifier fixed it
    f1 = facts(first=True, final=False, local_solver=1.0, local_verifier=0.0)   # verifier broke it
    rewards = readonly(np.array([1, 1, 1, 0, 0, 0], dtype=dtype))
    labels = [Role.SOLVER, Role.VERIFIER, Role.JUDGE] * 2
    metadata = {"facts": [f0, f0, f0, f1, f1, f1], "group_ids": [0] * 6}
    return rewards, labels, metadata


STRATEGIES = [
    ("identity", {}),
    ("potential_based", {"gamma": 0.9, "potential_type": "has_parsable_answer"}),
    ("difference_rewards", {}),
    ("coma_advantage", {}),
    ("reward_mixing", {"alpha": 0.3}),
    ("own_outcome", {}),
]


def shape(name, rewards, labels, metadata, **params):
    return resolve_sample_values(get_strategy(name, **params).shape(ShapingBatch(rewards, labels, **metadata)), rewards,
                               labels)


# --------------------------------------------------------------------------- registry and config


def test_registry_lists_builtins_and_unknown_name_lists_them():
    assert available_strategies() == BUILTIN
    with pytest.raises(KeyError) as exc:
        get_strategy("nope")
    assert all(name in str(exc.value) for name in BUILTIN)


def test_register_strategy_rejects_duplicates_and_non_strategies():
    with pytest.raises(ValueError, match="already registered"):
        register_strategy("identity")(type("Again", (IdentityStrategy,), {}))
    with pytest.raises(TypeError):
        register_strategy("not_a_strategy")(dict)
    assert available_strategies() == BUILTIN


@pytest.mark.parametrize("cfg", [None, {}, RewardShapingConfig(), {"strategy": None}])
def test_missing_config_is_identity_with_one_info_line(cfg, caplog):
    with caplog.at_level(logging.INFO, logger="trainer_client.credit.shaping"):
        strategy = create_strategy_from_config(cfg)
    assert isinstance(strategy, IdentityStrategy)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("trainer_client.credit.shaping", logging.INFO, "No reward shaping strategy configured, using identity")
    ]
    assert NO_STRATEGY_MESSAGE == "No reward shaping strategy configured, using identity"


def test_configured_strategy_is_built_with_params_and_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="trainer_client.credit.shaping"):
        strategy = create_strategy_from_config({"strategy": "reward_mixing", "params": {"alpha": 0.25}})
        explicit = create_strategy_from_config(RewardShapingConfig(strategy="identity"))
    assert strategy.name == "reward_mixing" and strategy.params.alpha == 0.25
    assert isinstance(explicit, IdentityStrategy)
    assert caplog.records == []
    defaults = RewardShapingConfig(strategy="potential_based").params
    assert defaults == {"gamma": 1.0, "potential_type": "has_parsable_answer"}


@pytest.mark.parametrize("cfg, match", [
    ({"strategy": "nope"}, "available: coma_advantage, difference_rewards"),
    ({"strategy": "potential_based", "params": {"gamma": 1.5}}, "gamma"),
    ({"strategy": "potential_based", "params": {"potential_type": "distance"}}, "potential_type"),
    ({"strategy": "reward_mixing", "params": {"alpha": -0.1}}, "alpha"),
    ({"strategy": "coma_advantage", "params": {"n": 4}}, "Extra inputs"),
    ({"params": {"alpha": 0.5}}, "without a strategy"),
    ({"strategy": "identity", "typo": 1}, "Extra inputs"),
])
def test_invalid_config_fails_at_load(cfg, match):
    with pytest.raises(ValidationError, match=match):
        RewardShapingConfig.model_validate(cfg)
    with pytest.raises(ValidationError):
        create_strategy_from_config(cfg)


# --------------------------------------------------------------------------- contract


def test_identity_equals_no_strategy():
    rewards, labels, metadata = mixed_batch()
    shaped = shape("identity", rewards, labels, metadata)
    unshaped = resolve_sample_values(rewards, rewards, labels)
    assert torch.allclose(torch.from_numpy(shaped), torch.from_numpy(unshaped), atol=1e-6, rtol=1e-5)
    np.testing.assert_array_equal(unshaped, [1, 1, 0, 0, 0, 0])


@pytest.mark.parametrize("name, params", STRATEGIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_strategy_keeps_dtype_zeroes_judge_and_never_mutates(name, params, dtype):
    rewards, labels, metadata = mixed_batch(dtype)
    raw_before = rewards.copy()
    result = get_strategy(name, **params).shape(ShapingBatch(rewards, labels, **metadata))
    arrays = result.values() if isinstance(result, dict) else [result]
    assert all(a.shape == (6,) and a.dtype == dtype for a in arrays)  # per-role results fill all B
    out = resolve_sample_values(result, rewards, labels)
    assert out.dtype == dtype
    assert out[2] == 0 and out[5] == 0                       # judge samples
    np.testing.assert_array_equal(rewards, raw_before)


def test_unknown_role_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown role"):
        ShapingBatch(np.zeros(2), ("solver", "critic"))
    with pytest.raises(ValueError, match="critic"):
        resolve_sample_values({"critic": np.zeros(2)}, np.zeros(2), [Role.SOLVER, Role.VERIFIER])


def test_malformed_batches_are_rejected():
    meta = {"group_ids": [0, 0]}
    two = (Role.SOLVER, Role.VERIFIER)
    with pytest.raises(TypeError):
        ShapingBatch(np.array([1, 0]), two, **meta)                  # int rewards
    with pytest.raises(ValueError):
        ShapingBatch(np.zeros((2, 1)), two, **meta)                  # not (B,)
    with pytest.raises(ValueError):
        ShapingBatch(np.zeros(2), (Role.SOLVER,), **meta)            # roles length
    with pytest.raises(ValueError, match="group_ids"):
        ShapingBatch(np.zeros(2), two, group_ids=[0])                # column length
    batch = ShapingBatch(np.zeros(2), ("solver", "verifier"), **meta)
    assert batch.roles == two and all(type(r) is Role for r in batch.roles) and batch.group_ids == (0, 0)
    np.testing.assert_array_equal(batch.is_role(Role.VERIFIER), [False, True])  # not numpy's str(Role) compare



def turns(*specs: tuple[str, ErrorKind | None]) -> list[TurnReward]:
    return [TurnReward(t=t, role=role, reward=0.0, error_kind=kind) for t, (role, kind) in enumerate(specs)]


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_potential_zero_leaves_rewards_unchanged(gamma):
    rewards, labels, metadata = mixed_batch()
    metadata["turns"] = [turns(("solver", None), ("verifier", None))] * 6
    out = get_strategy("potential_based", gamma=gamma, potential_type="zero").shape(ShapingBatch(rewards, labels, **metadata))
    np.testing.assert_array_equal(out, rewards)


def test_potential_has_parsable_answer_hand_computed():
    # episode A: solver boxed a wrong answer, then a parsable one; verifier gave no verdict last
    a = turns(("solver", ErrorKind.MISSING_FINAL_ANSWER), ("verifier", None),
              ("solver", ErrorKind.WRONG_ANSWER), ("verifier", ErrorKind.MISSING_VERDICT), ("judge", None))
    # episode B: the solver's last answer did not parse; the verifier's verdict was a false accept
    b = turns(("solver", ErrorKind.UNPARSEABLE_ANSWER), ("verifier", ErrorKind.FALSE_ACCEPT),
              ("judge", ErrorKind.MISSING_FINAL_ANSWER))
    rewards = readonly(np.array([0, 0, 0, 1, 1, 1, 1], dtype=np.float32))
    labels = ["solver", "verifier", "judge", "solver", "verifier", "judge", "solver"]
    metadata = {"turns": [a, a, a, b, b, b, None]}
    out = get_strategy("potential_based", gamma=0.5).shape(ShapingBatch(rewards, labels, **metadata))
    # r + γ·Φ(s') − Φ(s), Φ(s) = 0; the sample with no turns keeps its reward
    np.testing.assert_allclose(out, [0.5, 0.0, 0.5, 1.0, 1.5, 1.0, 1.0])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(resolve_sample_values(out, rewards, labels), [0.5, 0, 0, 1, 1.5, 0, 1])


# --------------------------------------------------------------------------- own_outcome


def test_own_outcome_credits_each_role_with_its_own_turns_not_the_judges_answer():
    rewards, labels, metadata = mixed_batch()
    # debate 0: the solver's answers right half the time, the verifier right, G = 1;
    # debate 1: the solver right, the verifier wrong (it broke the answer), G = 0
    out = shape("own_outcome", rewards, labels, metadata)
    np.testing.assert_array_equal(out, [0.5, 1.0, 0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(shape("reward_mixing", rewards, labels, metadata, alpha=0.0), out)
    # alpha 1 is identity; without facts a role's own outcome is G
    np.testing.assert_array_equal(shape("reward_mixing", rewards, labels, metadata, alpha=1.0), [1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(shape("own_outcome", rewards, labels, {}), [1, 1, 0, 0, 0, 0])


# --------------------------------------------------------------------------- difference_rewards


def test_difference_rewards_with_facts():
    rewards, labels, metadata = mixed_batch()
    result = get_strategy("difference_rewards").shape(ShapingBatch(rewards, labels, **metadata))
    assert set(result) == {"solver", "verifier"}
    # solver: G − 0; verifier: G − first_answer_correct, for every sample's episode
    np.testing.assert_array_equal(result["solver"], [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(result["verifier"], [1, 1, 1, -1, -1, -1])
    np.testing.assert_array_equal(resolve_sample_values(result, rewards, labels), [1, 1, 0, 0, -1, 0])


def test_difference_rewards_without_facts_is_raw():
    rewards = readonly(np.array([1, 0, 1, 0], dtype=np.float32))
    labels = ["solver", "verifier", "verifier", "judge"]
    present = facts(first=True, final=True)
    for metadata in ({}, {"facts": [None, None, None, None]}, {"facts": [present, None, None, present]}):
        out = shape("difference_rewards", rewards, labels, metadata)
        np.testing.assert_array_equal(out, [1, 0, 1, 0])


# --------------------------------------------------------------------------- coma_advantage


def cf(first: bool, accepted: bool, rounds: int = 1) -> CounterfactualFacts:
    """Facts of one debate for COMA: the first answer's correctness and the verdicts.

    ``accepted`` and ``rounds`` are the server's ``verifier_accepted`` and ``rounds``: the first
    verdict was an acceptance iff ``accepted and rounds == 1``.
    """
    return CounterfactualFacts(
        first_answer_correct=first, last_solver_answer_correct=first, final_answer_correct=first,
        judge_correct=None, verifier_accepted=accepted, rounds=rounds,
        local_rewards={Role.SOLVER: float(first), Role.VERIFIER: 0.0, Role.JUDGE: 0.0},
        rewards_without_role={Role.SOLVER: 0.0, Role.VERIFIER: float(first), Role.JUDGE: float(first)},
    )


ACCEPT, REJECT = True, False


def debates(rollouts, group_ids=(), roles=("solver", "verifier", "judge"), dtype=np.float32, pi=True):
    """(rewards, labels, metadata) of (rollout, role) samples, laid out as build_role_samples does.

    ``rollouts``: one ``(G, facts, π(accept))`` per rollout (``facts`` may be ``None``, ``π``
    ``None``); a 4th element overrides ``roles`` for that rollout. ``group_ids``: one per
    rollout (empty: no ``"group_ids"`` column). ``pi=False``: no ``verifier_accept_prob`` column.
    """
    rewards, labels, facts_col, pis, groups = [], [], [], [], []
    for k, (g, f, p, *own_roles) in enumerate(rollouts):
        for role in (own_roles[0] if own_roles else roles):
            rewards.append(g)
            labels.append(role)
            facts_col.append(f)
            pis.append(p if role == "verifier" else None)
            if group_ids:
                groups.append(group_ids[k])
    metadata = {"facts": facts_col}
    if pi:
        metadata[VERIFIER_ACCEPT_PROB] = pis
    if group_ids:
        metadata["group_ids"] = groups
    return readonly(np.array(rewards, dtype=dtype)), labels, metadata


def of_role(values, labels, role):
    return np.asarray(values)[[i for i, label in enumerate(labels) if label == role]]


def normalised(name, rewards, labels, metadata, **params):
    """Shaped sample values after the trainer's per-(group, role) normalisation (std scaling)."""
    return per_role_normalize(shape(name, rewards, labels, metadata, **params), labels, metadata["group_ids"])


# One prompt, four rollouts: G, the first answer's correctness F, the first verdict, π(accept).
HAND_COMPUTED = [
    (1.0, cf(first=True, accepted=ACCEPT), 0.9),    # r0: F=1, accepted, the judge kept it: G=1
    (0.0, cf(first=True, accepted=REJECT), 0.4),    # r1: F=1, rejected a right answer: G=0
    (1.0, cf(first=False, accepted=REJECT), 0.2),   # r2: F=0, rejected a wrong answer: G=1
    (0.0, cf(first=False, accepted=ACCEPT), 0.7),   # r3: F=0, accepted a wrong answer: G=0
]


def test_coma_verifier_hand_computed_differs_from_group_mean_after_normalisation():
    rewards, labels, metadata = debates(HAND_COMPUTED, group_ids=[0] * 4)
    result = get_strategy("coma_advantage").shape(ShapingBatch(rewards, labels, **metadata))
    # Q̂(accept) = F = [1, 1, 0, 0]
    # Q̂(reject): r0 accepted, rejected rollouts with F=1: {r1: G=0} -> 0; r1 rejected: own G=0;
    #            r2 rejected: own G=1; r3 accepted, rejected rollouts with F=0: {r2: G=1} -> 1
    # b = π·Q̂(accept) + (1−π)·Q̂(reject):
    #   r0 0.9·1 + 0.1·0 = 0.9   A = 1 − 0.9 =  0.1
    #   r1 0.4·1 + 0.6·0 = 0.4   A = 0 − 0.4 = −0.4
    #   r2 0.2·0 + 0.8·1 = 0.8   A = 1 − 0.8 =  0.2
    #   r3 0.7·0 + 0.3·1 = 0.3   A = 0 − 0.3 = −0.3
    np.testing.assert_allclose(of_role(result["verifier"], labels, "verifier"), [0.1, -0.4, 0.2, -0.3], atol=1e-6)
    # solver: group mean baseline, G − 0.5
    np.testing.assert_allclose(of_role(result["solver"], labels, "solver"), [0.5, -0.5, 0.5, -0.5])

    coma = normalised("coma_advantage", rewards, labels, metadata)
    identity = normalised("identity", rewards, labels, metadata)
    # COMA after normalisation: mean −0.1, centred [0.2, −0.3, 0.3, −0.2],
    #   std (ddof=1) = sqrt((0.04 + 0.09 + 0.09 + 0.04) / 3) = sqrt(0.26 / 3)
    expected = np.array([0.2, -0.3, 0.3, -0.2]) / (np.sqrt(0.26 / 3) + 1e-4)     # ≈ [0.68, −1.02, 1.02, −0.68]
    # group mean (identity): G = [1, 0, 1, 0], centred ±0.5, std = sqrt(1/3)
    group_mean = np.array([0.5, -0.5, 0.5, -0.5]) / (np.sqrt(1 / 3) + 1e-4)      # ≈ ±0.866
    np.testing.assert_allclose(of_role(coma, labels, "verifier"), expected, rtol=1e-5)
    np.testing.assert_allclose(of_role(identity, labels, "verifier"), group_mean, rtol=1e-5)
    assert not np.allclose(of_role(coma, labels, "verifier"), group_mean, atol=1e-3)
    # the right rejection (r2) now ranks above the kept right acceptance (r0)
    assert of_role(coma, labels, "verifier")[2] > of_role(coma, labels, "verifier")[0]
    # the solver keeps the group-mean baseline: the same normalised advantages as identity
    np.testing.assert_allclose(of_role(coma, labels, "solver"), of_role(identity, labels, "solver"), rtol=1e-6)
    np.testing.assert_array_equal(of_role(coma, labels, "judge"), [0, 0, 0, 0])


def test_coma_equals_group_mean_after_normalisation_when_both_verdicts_have_the_same_value():
    # Every rejected rollout ended as its first answer was (G = F), and F is constant per
    # group, so Q̂(accept)_i = Q̂(reject)_i = F for every verifier sample and b_i = F whatever π.
    rollouts = [
        (1.0, cf(first=True, accepted=REJECT), 0.3),    # group 0, F=1: Q̂(reject) = own G = 1
        (1.0, cf(first=True, accepted=REJECT), 0.8),
        (1.0, cf(first=True, accepted=ACCEPT), 0.6),    # Q̂(reject) = mean G of rejected F=1 = 1
        (0.0, cf(first=True, accepted=ACCEPT), 0.1),    # the judge overruled a right acceptance
        (0.0, cf(first=False, accepted=REJECT), 0.5),   # group 1, F=0: Q̂(reject) = 0
        (1.0, cf(first=False, accepted=ACCEPT), 0.9),   # the judge fixed a false acceptance
        (0.0, cf(first=False, accepted=ACCEPT), 0.2),
        (0.0, cf(first=False, accepted=REJECT), 0.7),
    ]
    rewards, labels, metadata = debates(rollouts, group_ids=[0] * 4 + [1] * 4)
    result = get_strategy("coma_advantage").shape(ShapingBatch(rewards, labels, **metadata))
    # b = 1 in group 0, 0 in group 1: A = G − 1 and A = G; not the group-mean values before normalisation
    np.testing.assert_allclose(of_role(result["verifier"], labels, "verifier"), [0, 0, 0, -1, 0, 1, 0, 0])
    coma = normalised("coma_advantage", rewards, labels, metadata)
    identity = normalised("identity", rewards, labels, metadata)
    np.testing.assert_allclose(coma, identity, atol=1e-6)
    assert np.any(of_role(coma, labels, "verifier") != 0)  # not vacuous


@pytest.mark.parametrize("metadata", [
    {"group_ids": [3] * 8},
    {"group_ids": [3] * 8, "facts": [None] * 8, VERIFIER_ACCEPT_PROB: [None, 0.5] * 4},
])
def test_coma_worked_example_without_facts_is_the_group_mean(metadata):
    # 4 rollouts of one prompt, rewards [5, 0, 5, 0], no facts: no counterfactual information
    rewards = readonly(np.array([5, 5, 0, 0, 5, 5, 0, 0], dtype=np.float32))
    labels = ["solver", "verifier"] * 4
    out = shape("coma_advantage", rewards, labels, metadata)
    np.testing.assert_array_equal(out, [2.5, 2.5, -2.5, -2.5, 2.5, 2.5, -2.5, -2.5])


def test_coma_without_facts_keeps_per_group_and_role_means_without_judges():
    # group 0: solver rewards [5, 0, 5, 0]; interleaved verifier samples with their own baseline
    # and judge samples (raw 5 or 0) that must not move either baseline; group 1: one solver only
    rewards = readonly(np.array([5, 5, 5, 0, 1, 0, 5, 5, 5, 0, 1, 0, 4], dtype=np.float64))
    labels = ["solver", "verifier", "judge"] * 4 + ["solver"]
    metadata = {"group_ids": [0] * 12 + [1]}
    result = get_strategy("coma_advantage").shape(ShapingBatch(rewards, labels, **metadata))
    out = resolve_sample_values(result, rewards, labels)
    np.testing.assert_array_equal(out[0::3][:4], [2.5, -2.5, 2.5, -2.5])  # solvers
    np.testing.assert_array_equal(out[1::3], [2, -2, 2, -2])               # verifiers: mean 3
    np.testing.assert_array_equal(out[2::3], [0, 0, 0, 0])                 # judges
    assert out[12] == 0.0                                                  # lone solver: r − r
    np.testing.assert_array_equal(result["verifier"][12], 4.0)             # no verifier in group 1


def test_coma_no_rejected_rollout_with_the_same_first_answer_falls_back_to_group_mean():
    rollouts = [
        (1.0, cf(first=True, accepted=ACCEPT), 0.8),
        (1.0, cf(first=True, accepted=ACCEPT), 0.6),
        (1.0, cf(first=False, accepted=REJECT), 0.3),
        (0.0, cf(first=False, accepted=ACCEPT), 0.5),
    ]
    rewards, labels, metadata = debates(rollouts, group_ids=[0] * 4)
    out = of_role(shape("coma_advantage", rewards, labels, metadata), labels, "verifier")
    # verifier group mean 0.75
    # r0, r1: accepted with F=1 and no rejected rollout with F=1: fallback, 1 − 0.75 = 0.25
    # r2: rejected, Q̂(reject) = 1, Q̂(accept) = 0: b = 0.3·0 + 0.7·1 = 0.7, A = 0.3
    # r3: Q̂(reject) = r2's G = 1, Q̂(accept) = 0: b = 0.5·0 + 0.5·1 = 0.5, A = −0.5
    np.testing.assert_allclose(out, [0.25, 0.25, 0.3, -0.5], atol=1e-6)


def test_coma_item_without_facts_falls_back_and_stays_out_of_the_statistics():
    rollouts = [
        (0.0, None, 0.9),                               # facts missing
        (1.0, cf(first=False, accepted=REJECT), 0.4),
        (0.0, cf(first=False, accepted=ACCEPT), 0.5),
        (1.0, cf(first=True, accepted=ACCEPT), 0.9),
    ]
    rewards, labels, metadata = debates(rollouts, group_ids=[0] * 4)
    out = of_role(shape("coma_advantage", rewards, labels, metadata), labels, "verifier")
    # verifier group mean 0.5 (every verifier sample, r0 included)
    # r0: no facts: fallback, 0 − 0.5 = −0.5
    # r1: rejected, b = 0.4·0 + 0.6·1 = 0.6, A = 0.4
    # r2: Q̂(reject) = mean G of rejected F=0 with facts = r1's 1 (r0 is not in the pool),
    #     b = 0.5·0 + 0.5·1 = 0.5, A = −0.5
    # r3: no rejected rollout with F=1: fallback, 1 − 0.5 = 0.5
    np.testing.assert_allclose(out, [-0.5, 0.4, -0.5, 0.5], atol=1e-6)


EMPIRICAL = [
    (1.0, cf(first=True, accepted=ACCEPT), 0.9),
    (1.0, cf(first=True, accepted=ACCEPT), None),
    (0.0, cf(first=True, accepted=REJECT), 0.2),
    (1.0, cf(first=False, accepted=REJECT), None),
]


def test_coma_without_pi_column_uses_the_empirical_acceptance_rate():
    rewards, labels, metadata = debates(EMPIRICAL, group_ids=[0] * 4, pi=False)
    out = of_role(shape("coma_advantage", rewards, labels, metadata), labels, "verifier")
    # π̂ = 2 accepted / 4 verifier samples with facts = 0.5
    # r0, r1: Q̂(accept) = 1, Q̂(reject) = r2's G = 0: b = 0.5, A = 0.5
    # r2: Q̂(accept) = 1, Q̂(reject) = own 0: b = 0.5, A = −0.5
    # r3: Q̂(accept) = 0, Q̂(reject) = own 1: b = 0.5, A = 0.5
    np.testing.assert_allclose(out, [0.5, 0.5, -0.5, 0.5], atol=1e-6)
    assert not np.allclose(out, rewards[1::3] - 0.75)  # not the group mean


def test_coma_pi_none_for_an_item_uses_the_empirical_acceptance_rate():
    rewards, labels, metadata = debates(EMPIRICAL, group_ids=[0] * 4)
    out = of_role(shape("coma_advantage", rewards, labels, metadata), labels, "verifier")
    # r0: π = 0.9: b = 0.9·1 + 0.1·0 = 0.9, A = 0.1;  r1: π̂ = 0.5: A = 0.5
    # r2: π = 0.2: b = 0.2·1 + 0.8·0 = 0.2, A = −0.2; r3: π̂ = 0.5: A = 0.5
    np.testing.assert_allclose(out, [0.1, 0.5, -0.2, 0.5], atol=1e-6)


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), "high"])
def test_coma_rejects_a_bad_accept_probability(bad):
    rollouts = [(1.0, cf(first=True, accepted=ACCEPT), bad), (0.0, cf(first=True, accepted=REJECT), 0.5)]
    rewards, labels, metadata = debates(rollouts, group_ids=[0, 0])
    with pytest.raises(ValueError, match=VERIFIER_ACCEPT_PROB):
        get_strategy("coma_advantage").shape(ShapingBatch(rewards, labels, **metadata))


def test_coma_pi_column_is_read_on_verifier_items_only():
    rewards, labels, metadata = debates(HAND_COMPUTED, group_ids=[0] * 4)
    pis = zip(metadata[VERIFIER_ACCEPT_PROB], labels, strict=True)
    noisy = dict(metadata, **{VERIFIER_ACCEPT_PROB: [p if label == "verifier" else "ignored" for p, label in pis]})
    np.testing.assert_array_equal(shape("coma_advantage", rewards, labels, noisy),
                                  shape("coma_advantage", rewards, labels, metadata))


def test_coma_single_round_rejection_goes_to_the_judge_and_the_formula_applies():
    # max_rounds = 1: a rejection sends the debate straight to the judge (rounds == 1 always)
    rollouts = [
        (1.0, cf(first=True, accepted=REJECT), 0.5),    # the judge boxed nothing: G = F = 1
        (1.0, cf(first=False, accepted=REJECT), 0.25),  # the judge fixed the rejected answer
        (0.0, cf(first=False, accepted=ACCEPT), 0.75),
        (1.0, cf(first=True, accepted=ACCEPT), 0.5),
    ]
    rewards, labels, metadata = debates(rollouts, group_ids=[0] * 4)
    out = of_role(shape("coma_advantage", rewards, labels, metadata), labels, "verifier")
    # r0: Q̂(accept) = 1, Q̂(reject) = 1: b = 1, A = 0
    # r1: Q̂(accept) = 0, Q̂(reject) = 1: b = 0.25·0 + 0.75·1 = 0.75, A = 0.25
    # r2: Q̂(accept) = 0, Q̂(reject) = r1's G = 1: b = 0.75·0 + 0.25·1 = 0.25, A = −0.25
    # r3: Q̂(accept) = 1, Q̂(reject) = r0's G = 1: b = 1, A = 0
    np.testing.assert_allclose(out, [0, 0.25, -0.25, 0], atol=1e-6)


def test_coma_rejection_then_later_acceptance_counts_as_a_rejection():
    rollouts = [
        (1.0, cf(first=False, accepted=True, rounds=2), 0.4),  # rejected round 0, accepted round 1
        (0.0, cf(first=False, accepted=ACCEPT), 0.5),
    ]
    rewards, labels, metadata = debates(rollouts, group_ids=[0, 0])
    out = of_role(shape("coma_advantage", rewards, labels, metadata), labels, "verifier")
    # r0: first verdict a rejection: Q̂(reject) = own G = 1, b = 0.4·0 + 0.6·1 = 0.6, A = 0.4
    # r1: Q̂(reject) = r0's G = 1: b = 0.5·0 + 0.5·1 = 0.5, A = −0.5
    np.testing.assert_allclose(out, [0.4, -0.5], atol=1e-6)


NO_VERIFIER = [
    (1.0, cf(first=True, accepted=ACCEPT), 0.5),
    (0.0, cf(first=True, accepted=REJECT), None, ("solver", "judge")),  # the verifier never acted
    (1.0, cf(first=False, accepted=REJECT), 0.5),
]


def test_coma_rollout_without_verifier_item_is_in_no_verifier_statistic():
    rewards, labels, metadata = debates(NO_VERIFIER, group_ids=[0] * 3)
    assert labels.count("verifier") == 2
    result = get_strategy("coma_advantage").shape(ShapingBatch(rewards, labels, **metadata))
    # r0: no verifier *sample* rejected with F=1 (r1 has none): fallback, 1 − mean(1, 1) = 0
    #     (counting r1 would give Q̂(reject) = 0, b = 0.5 and A = 0.5)
    # r2: rejected, Q̂(accept) = 0, Q̂(reject) = 1: b = 0.5, A = 0.5
    np.testing.assert_allclose(of_role(result["verifier"], labels, "verifier"), [0, 0.5], atol=1e-6)
    np.testing.assert_allclose(of_role(result["solver"], labels, "solver"), np.array([1, 0, 1]) - 2 / 3, atol=1e-6)


@pytest.mark.parametrize("batch", [HAND_COMPUTED * 2, NO_VERIFIER * 2])
def test_coma_groups_by_n_rollouts_per_prompt_without_group_ids(batch):
    n = len(batch) // 2
    by_ids = debates(batch, group_ids=[0] * n + [1] * n)
    rewards, labels, metadata = debates(batch)  # no "group_ids"
    out = shape("coma_advantage", rewards, labels, metadata, n_rollouts_per_prompt=n)
    np.testing.assert_array_equal(out, shape("coma_advantage", *by_ids))


def test_coma_n_rollouts_per_prompt_counts_rollouts_not_items():
    rewards, labels, metadata = debates(HAND_COMPUTED * 2)  # 8 rollouts, 24 samples
    two = shape("coma_advantage", rewards, labels, metadata, n_rollouts_per_prompt=2)
    expected = shape("coma_advantage", *debates(HAND_COMPUTED * 2, group_ids=[0, 0, 1, 1, 2, 2, 3, 3]))
    np.testing.assert_array_equal(two, expected)
    # sample index // 2 would split rollouts across groups: other values
    by_sample = shape("coma_advantage", rewards, labels, dict(metadata, group_ids=[i // 2 for i in range(24)]))
    assert not np.array_equal(by_sample, two)
    with pytest.raises(ValueError, match="not a multiple of n_rollouts_per_prompt=3"):
        shape("coma_advantage", rewards, labels, metadata, n_rollouts_per_prompt=3)


def test_coma_group_ids_take_precedence_over_n_rollouts_per_prompt():
    rewards, labels, metadata = debates(HAND_COMPUTED * 2, group_ids=[0] * 4 + [1] * 4)
    np.testing.assert_array_equal(shape("coma_advantage", rewards, labels, metadata, n_rollouts_per_prompt=8),
                                  shape("coma_advantage", rewards, labels, metadata))


def test_coma_needs_group_ids_or_n_rollouts_per_prompt():
    with pytest.raises(ValueError, match=r"group_ids.*n_rollouts_per_prompt"):
        get_strategy("coma_advantage").shape(ShapingBatch(np.zeros(2), ("solver", "solver")))
    with pytest.raises(ValidationError):
        get_strategy("coma_advantage", n_rollouts_per_prompt=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_coma_keeps_dtype_zeroes_judges_and_never_mutates(dtype):
    rewards, labels, metadata = debates(HAND_COMPUTED + NO_VERIFIER[:2], group_ids=[0] * 4 + [1] * 2, dtype=dtype)
    before = {key: copy.deepcopy(list(column)) for key, column in metadata.items()}
    raw = rewards.copy()
    result = get_strategy("coma_advantage").shape(ShapingBatch(rewards, labels, **metadata))
    assert set(result) == {"solver", "verifier"}
    assert all(a.shape == (len(labels),) and a.dtype == dtype for a in result.values())
    out = resolve_sample_values(result, rewards, labels)
    assert out.dtype == dtype
    np.testing.assert_array_equal(of_role(out, labels, "judge"), np.zeros(labels.count("judge")))
    np.testing.assert_array_equal(rewards, raw)
    assert {key: list(column) for key, column in metadata.items()} == before


# --------------------------------------------------------------------------- reward_mixing


def test_reward_mixing_hand_computed():
    rewards, labels, metadata = mixed_batch()
    result = get_strategy("reward_mixing", alpha=0.25).shape(ShapingBatch(rewards, labels, **metadata))
    # episode 0: G=1, local solver 0.5, verifier 1.0; episode 1: G=0, local solver 1.0, verifier 0.0
    np.testing.assert_allclose(result["solver"][[0, 3]], [0.25 + 0.75 * 0.5, 0.75 * 1.0])
    np.testing.assert_allclose(result["verifier"][[1, 4]], [1.0, 0.0])
    np.testing.assert_allclose(resolve_sample_values(result, rewards, labels), [0.625, 1, 0, 0.75, 0, 0])


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_reward_mixing_without_facts_is_g_for_any_alpha(alpha):
    rewards = readonly(np.array([1, 0, 1, 1], dtype=np.float32))
    labels = ["solver", "verifier", "verifier", "solver"]
    result = get_strategy("reward_mixing", alpha=alpha).shape(ShapingBatch(rewards, labels, facts=[None] * 4))
    for values in result.values():
        np.testing.assert_array_equal(values, rewards)


# --------------------------------------------------------------------------- metrics


def test_unshaped_metrics_are_raw_means_after_shaping_ran():
    rewards, labels, metadata = mixed_batch()
    shaped = shape("difference_rewards", rewards, labels, metadata)
    m = shaping_metrics(rewards, shaped, labels, metadata["group_ids"])
    assert m["reward/raw/solver_mean"] == pytest.approx(0.5)    # raw G of samples 0 and 3
    assert m["reward/raw/verifier_mean"] == pytest.approx(0.5)
    assert m["reward/shaped/solver_mean"] == pytest.approx(0.5)
    assert m["reward/shaped/verifier_mean"] == pytest.approx(0.0)  # (1 + −1) / 2
    assert not any("judge" in key for key in m)


def test_zero_std_group_fraction_excludes_judges():
    raw = np.array([1, 1, 0, 1, 0, 0, 1, 1], dtype=np.float32)
    labels = ["solver", "judge", "solver", "judge", "solver", "solver", "verifier", "verifier"]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    # groups: (0, solver) [1, 0] varies; (1, solver) [0, 0] flat; (1, verifier) [1, 1] flat.
    # Counting the judges would make (0, judge) a fourth group.
    shaped = np.array([0.5, 0, -0.5, 0, 0, 0, 1, 2], dtype=np.float32)
    m = shaping_metrics(raw, shaped, labels, groups)
    assert m["reward/raw/zero_std_group_frac"] == pytest.approx(2 / 3)
    assert m["reward/shaped/zero_std_group_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        shaping_metrics(raw, shaped[:3], labels, groups)


# --------------------------------------------------------------------------- packaging


def test_shaping_core_imports_without_torch():
    code = "import sys, trainer_client.credit.shaping; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_strategies_subclass_the_abc():
    assert all(issubclass(type(get_strategy(name)), RewardShapingStrategy) for name in BUILTIN)
    with pytest.raises(TypeError):
        RewardShapingStrategy()
