"""The factorial's contrasts in an ablation's report, by hand: arms matched by preset within
each credit (the recipe's arms are ``<preset>+own_outcome``), greedy and sampled."""

from __future__ import annotations

import pytest

from trainer_client.ablation.report import channel_effects
from trainer_client.ablation.runs import RunResult


def _run(arm: str, seed: int, correct: list[bool], sampled: list[float] | None = None) -> RunResult:
    return RunResult(arm=arm, seed=seed, rl_seconds=1.0, steps=1, gold_supervised=False, curve=[], means={},
                     pairs_stored=0.0, heldout={}, correct=correct,
                     per_problem={"sampled_accuracy": sampled} if sampled is not None else {})


def test_contrasts_pair_arms_by_preset_within_their_credit() -> None:
    # 2 seeds x 4 problems; per seed, accuracy: baseline 0.5, sdpo 0.75, replay 0.25, full 0.5
    arms = {}
    for preset, row in {"baseline": [1, 1, 0, 0], "sdpo": [1, 1, 1, 0], "replay": [1, 0, 0, 0],
                        "full": [0, 1, 1, 0]}.items():
        arms[f"{preset}+own_outcome"] = [_run(f"{preset}+own_outcome", s, [bool(x) for x in row],
                                              [x / 2 for x in row]) for s in (0, 1)]
    arms["baseline"] = [_run("baseline", 0, [True] * 4)]  # another credit's lone arm: no contrast of its own
    effects = channel_effects(arms)
    assert set(effects) == {"sdpo - baseline (own_outcome)", "replay - baseline (own_outcome)",
                            "full - baseline (own_outcome)",
                            "interaction (full - sdpo - replay + baseline) (own_outcome)"}
    assert effects["sdpo - baseline (own_outcome)"]["mean"] == pytest.approx(0.25)
    assert effects["replay - baseline (own_outcome)"]["mean"] == pytest.approx(-0.25)
    assert effects["full - baseline (own_outcome)"]["mean"] == pytest.approx(0.0)
    # full - sdpo - replay + baseline = 0.5 - 0.75 - 0.25 + 0.5
    assert effects["interaction (full - sdpo - replay + baseline) (own_outcome)"]["mean"] == pytest.approx(0.0)
    assert effects["sdpo - baseline (own_outcome)"]["sampled"]["mean"] == pytest.approx(0.125)
    assert effects["sdpo - baseline (own_outcome)"]["seeds"] == [0, 1]


def test_plain_preset_names_keep_their_contrast_names_and_runs_without_samples_give_none() -> None:
    arms = {preset: [_run(preset, 0, [True, False]), _run(preset, 1, [True, True])]
            for preset in ("baseline", "sdpo")}
    effects = channel_effects(arms)
    assert set(effects) == {"sdpo - baseline"}
    assert effects["sdpo - baseline"]["mean"] == 0.0 and effects["sdpo - baseline"]["sampled"] is None
