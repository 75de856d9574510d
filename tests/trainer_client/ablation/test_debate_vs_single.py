"""How many sampled answers fit in a debate's inference tokens (issue 55's majority vote at equal
inference tokens), and the pairing of a debate arm with its single-mode twin."""

from __future__ import annotations

import pytest

from trainer_client.ablation.debate_vs_single import debate_vs_single, equal_token_votes
from trainer_client.ablation.runs import RunResult


def test_equal_token_votes_floor_clamp_and_cap() -> None:
    assert equal_token_votes(95.0, 30.0, 8) == (3, False)  # ⌊95 / 30⌋
    assert equal_token_votes(20.0, 30.0, 8) == (1, False)  # at least one sample
    assert equal_token_votes(400.0, 30.0, 8) == (8, True)  # 13 would fit; 8 were drawn
    for debate, sample, drawn in ((None, 30.0, 8), (90.0, 0.0, 8), (90.0, 30.0, 0)):
        with pytest.raises(ValueError):
            equal_token_votes(debate, sample, drawn)


def _run(arm: str, seed: int, mode: str, heldout: dict, tokens: float) -> RunResult:
    return RunResult(arm, seed, 1.0, 1, False, [{"step": 1, "tokens/sampled": tokens}], {}, 0.0, heldout, [], mode)


def test_pairs_by_seed_and_unequal_compute_is_said() -> None:
    debate = {"final_accuracy": 0.7, "debate_tokens": 100.0}
    single = {"accuracy": 0.5, "sample_tokens": 50.0, "majority_accuracy_by_k": [0.5, 0.6]}
    arms = {"baseline+own_outcome": [_run("baseline+own_outcome", s, "debate", debate, 1000.0) for s in (0, 1, 2)],
            "baseline+own_outcome+single": [_run("baseline+own_outcome+single", s, "single", single, 1200.0)
                                            for s in (1, 2)],
            "sdpo+own_outcome": [_run("sdpo+own_outcome", 0, "debate", debate, 1000.0)]}  # no twin: left out
    out = debate_vs_single(arms)
    assert list(out) == ["baseline+own_outcome"]
    pair = out["baseline+own_outcome"]
    assert pair["seeds"] == [1, 2] and pair["k"] == [2, 2]  # seed 0 has no single run
    assert pair["by_seed"] == pytest.approx([0.1, 0.1]) and pair["vs_greedy"]["mean"] == pytest.approx(0.2)
    assert not pair["equal_tokens"]  # 1,200 against 1,000 sampled tokens: 20% apart
    # a single arm evaluated without samples (no majority vote) gives no comparison rather than a wrong one
    no_votes = {**arms, "baseline+own_outcome+single": [_run("x", 1, "single", {**single, "majority_accuracy_by_k": None},
                                                             1000.0)]}
    assert debate_vs_single(no_votes) == {}
