"""Reward shaping strategies, registry and config (numpy core)."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from env_server.markers import ErrorKind, Role
from env_server.models import CounterfactualFacts, TurnReward
from trainer_client.role_mapping import resolve_item_values
from trainer_client.shaping import (
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

BUILTIN = ("coma_advantage", "difference_rewards", "identity", "potential_based", "reward_mixing")


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
    """Two debates of one prompt, flattened to (rollout, role) items, plus an unknown role."""
    f0 = facts(first=False, final=True, local_solver=0.5, local_verifier=1.0)   # verifier fixed it
    f1 = facts(first=True, final=False, local_solver=1.0, local_verifier=0.0)   # verifier broke it
    rewards = readonly(np.array([1, 1, 1, 0, 0, 0, 1], dtype=dtype))
    labels = ["solver", "verifier", "judge", "solver", "verifier", "judge", "critic"]
    metadata = {"facts": [f0, f0, f0, f1, f1, f1, f0], "group_ids": [0] * 7}
    return rewards, labels, metadata


STRATEGIES = [
    ("identity", {}),
    ("potential_based", {"gamma": 0.9, "potential_type": "has_parsable_answer"}),
    ("difference_rewards", {}),
    ("coma_advantage", {}),
    ("reward_mixing", {"alpha": 0.3}),
]


def shape(name, rewards, labels, metadata, **params):
    return resolve_item_values(get_strategy(name, **params).shape_rewards(rewards, labels, metadata), rewards, labels)


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
    with caplog.at_level(logging.INFO, logger="trainer_client.shaping"):
        strategy = create_strategy_from_config(cfg)
    assert isinstance(strategy, IdentityStrategy)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("trainer_client.shaping", logging.INFO, "No reward shaping strategy configured, using identity")
    ]
    assert NO_STRATEGY_MESSAGE == "No reward shaping strategy configured, using identity"


def test_configured_strategy_is_built_with_params_and_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="trainer_client.shaping"):
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
    unshaped = resolve_item_values(rewards, rewards, labels)
    assert torch.allclose(torch.from_numpy(shaped), torch.from_numpy(unshaped), atol=1e-6, rtol=1e-5)
    np.testing.assert_array_equal(unshaped, [1, 1, 0, 0, 0, 0, 1])


@pytest.mark.parametrize("name, params", STRATEGIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_strategy_keeps_dtype_zeroes_judge_and_never_mutates(name, params, dtype):
    rewards, labels, metadata = mixed_batch(dtype)
    raw_before = rewards.copy()
    result = get_strategy(name, **params).shape_rewards(rewards, labels, metadata)
    arrays = result.values() if isinstance(result, dict) else [result]
    assert all(a.shape == (7,) and a.dtype == dtype for a in arrays)  # per-role results fill all B
    out = resolve_item_values(result, rewards, labels)
    assert out.dtype == dtype
    assert out[2] == 0 and out[5] == 0                       # judge items
    np.testing.assert_array_equal(rewards, raw_before)


@pytest.mark.parametrize("name, params", STRATEGIES)
def test_unknown_role_falls_back_to_raw(name, params):
    rewards, labels, metadata = mixed_batch()
    assert shape(name, rewards, labels, metadata, **params)[6] == rewards[6]


@pytest.mark.parametrize("name, params", STRATEGIES)
def test_malformed_batches_are_rejected(name, params):
    strategy = get_strategy(name, **params)
    meta = {"group_ids": [0, 0]}
    with pytest.raises(TypeError):
        strategy.shape_rewards(np.array([1, 0]), ["solver", "verifier"], meta)            # int rewards
    with pytest.raises(ValueError):
        strategy.shape_rewards(np.zeros((2, 1)), ["solver", "verifier"], meta)            # not (B,)
    with pytest.raises(ValueError):
        strategy.shape_rewards(np.zeros(2), ["solver"], meta)                             # labels length
    with pytest.raises(ValueError):
        strategy.shape_rewards(np.zeros(2), ["solver", "verifier"], {"group_ids": [0]})   # column length


# --------------------------------------------------------------------------- potential_based


def turns(*specs: tuple[str, ErrorKind | None]) -> list[TurnReward]:
    return [TurnReward(t=t, role=role, reward=0.0, error_kind=kind) for t, (role, kind) in enumerate(specs)]


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_potential_zero_leaves_rewards_unchanged(gamma):
    rewards, labels, metadata = mixed_batch()
    metadata["turns"] = [turns(("solver", None), ("verifier", None))] * 7
    out = get_strategy("potential_based", gamma=gamma, potential_type="zero").shape_rewards(rewards, labels, metadata)
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
    out = get_strategy("potential_based", gamma=0.5).shape_rewards(rewards, labels, metadata)
    # r + γ·Φ(s') − Φ(s), Φ(s) = 0; the item with no turns keeps its reward
    np.testing.assert_allclose(out, [0.5, 0.0, 0.5, 1.0, 1.5, 1.0, 1.0])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(resolve_item_values(out, rewards, labels), [0.5, 0, 0, 1, 1.5, 0, 1])


# --------------------------------------------------------------------------- difference_rewards


def test_difference_rewards_with_facts():
    rewards, labels, metadata = mixed_batch()
    result = get_strategy("difference_rewards").shape_rewards(rewards, labels, metadata)
    assert set(result) == {"solver", "verifier"}
    # solver: G − 0; verifier: G − first_answer_correct, for every item's episode
    np.testing.assert_array_equal(result["solver"], [1, 1, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(result["verifier"], [1, 1, 1, -1, -1, -1, 1])
    np.testing.assert_array_equal(resolve_item_values(result, rewards, labels), [1, 1, 0, 0, -1, 0, 1])


def test_difference_rewards_without_facts_is_raw():
    rewards = readonly(np.array([1, 0, 1, 0], dtype=np.float32))
    labels = ["solver", "verifier", "verifier", "judge"]
    present = facts(first=True, final=True)
    for metadata in ({}, {"facts": [None, None, None, None]}, {"facts": [present, None, None, present]}):
        out = shape("difference_rewards", rewards, labels, metadata)
        np.testing.assert_array_equal(out, [1, 0, 1, 0])


# --------------------------------------------------------------------------- coma_advantage


def test_coma_example_from_the_issue():
    rewards = readonly(np.array([5, 0, 5, 0], dtype=np.float32))
    out = shape("coma_advantage", rewards, ["solver"] * 4, {"group_ids": [3] * 4})
    np.testing.assert_array_equal(out, [2.5, -2.5, 2.5, -2.5])


def test_coma_baseline_per_group_and_role_without_judges():
    # group 0: solver rewards [5, 0, 5, 0]; interleaved verifier items with their own baseline
    # and judge items (raw 5 or 0) that must not move either baseline; group 1: one solver only
    rewards = readonly(np.array([5, 5, 5, 0, 1, 0, 5, 5, 5, 0, 1, 0, 4], dtype=np.float64))
    labels = ["solver", "verifier", "judge"] * 4 + ["solver"]
    metadata = {"group_ids": [0] * 12 + [1]}
    result = get_strategy("coma_advantage").shape_rewards(rewards, labels, metadata)
    out = resolve_item_values(result, rewards, labels)
    np.testing.assert_array_equal(out[0::3][:4], [2.5, -2.5, 2.5, -2.5])  # solvers
    np.testing.assert_array_equal(out[1::3], [2, -2, 2, -2])               # verifiers: mean 3
    np.testing.assert_array_equal(out[2::3], [0, 0, 0, 0])                 # judges
    assert out[12] == 0.0                                                  # lone solver: r − r
    np.testing.assert_array_equal(result["verifier"][12], 4.0)             # no verifier in group 1


def test_coma_needs_group_ids():
    with pytest.raises(KeyError, match="group_ids"):
        get_strategy("coma_advantage").shape_rewards(np.zeros(2), ["solver", "solver"], {})


# --------------------------------------------------------------------------- reward_mixing


def test_reward_mixing_hand_computed():
    rewards, labels, metadata = mixed_batch()
    result = get_strategy("reward_mixing", alpha=0.25).shape_rewards(rewards, labels, metadata)
    # episode 0: G=1, local solver 0.5, verifier 1.0; episode 1: G=0, local solver 1.0, verifier 0.0
    np.testing.assert_allclose(result["solver"][[0, 3]], [0.25 + 0.75 * 0.5, 0.75 * 1.0])
    np.testing.assert_allclose(result["verifier"][[1, 4]], [1.0, 0.0])
    np.testing.assert_allclose(resolve_item_values(result, rewards, labels), [0.625, 1, 0, 0.75, 0, 0, 1])


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_reward_mixing_without_facts_is_g_for_any_alpha(alpha):
    rewards = readonly(np.array([1, 0, 1, 1], dtype=np.float32))
    labels = ["solver", "verifier", "verifier", "solver"]
    result = get_strategy("reward_mixing", alpha=alpha).shape_rewards(rewards, labels, {"facts": [None] * 4})
    for values in result.values():
        np.testing.assert_array_equal(values, rewards)


# --------------------------------------------------------------------------- metrics


def test_unshaped_metrics_are_raw_means_after_shaping_ran():
    rewards, labels, metadata = mixed_batch()
    shaped = shape("difference_rewards", rewards, labels, metadata)
    m = shaping_metrics(rewards, shaped, labels, metadata["group_ids"])
    assert m["reward/raw/solver_mean"] == pytest.approx(0.5)    # raw G of items 0 and 3
    assert m["reward/raw/verifier_mean"] == pytest.approx(0.5)
    assert m["reward/raw/critic_mean"] == pytest.approx(1.0)
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
    code = "import sys, trainer_client.shaping; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_strategies_subclass_the_abc():
    assert all(issubclass(type(get_strategy(name)), RewardShapingStrategy) for name in BUILTIN)
    with pytest.raises(TypeError):
        RewardShapingStrategy()
