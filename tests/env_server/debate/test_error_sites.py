"""Localised hints (RFC 0002 "Localised hints"): where a wrong answer goes wrong, never the answer."""

from __future__ import annotations

import pytest
from debate_steps import act

from env_server.debate.episode import DebateEpisode
from env_server.debate.error_sites import localised_hint
from env_server.debate.problems import ProblemGenerator
from env_server.debate.rewards import episode_rewards_data
from env_server.protocol.grades import Grade
from env_server.protocol.markers import ErrorKind, Role
from env_server.protocol.models import EpisodeRewards

SUMS = ProblemGenerator(families=["two_digit_sum"])


def sum_problem(a: int, b: int):
    """The two_digit_sum problem ``a + b`` (searched among the generator's seeds)."""
    return next(p for p in map(SUMS.by_seed, range(20_000)) if p.problem == f"Compute ${a} + {b}$.")


@pytest.mark.parametrize(("answer", "hint"), [
    ("67", "Your final answer 67 is not correct: its ones digit is wrong."),
    ("76", "Your final answer 76 is not correct: its tens digit is wrong."),
    ("77", "Your final answer 77 is not correct: its ones and tens digits are wrong."),
    ("166", "Your final answer 166 is not correct: its tens digit is wrong."),
    (" 065 ", "Your final answer 65 is not correct: its ones digit is wrong."),
])
def test_the_hint_says_which_digits_are_wrong_and_never_the_answer(answer: str, hint: str) -> None:
    problem = sum_problem(24, 42)  # 66
    assert localised_hint(problem, Role.SOLVER, ErrorKind.WRONG_ANSWER, answer) == hint
    assert localised_hint(problem, Role.JUDGE, "wrong_answer", answer) == hint


def test_no_localised_hint_where_the_family_cannot_say_where() -> None:
    problem = sum_problem(24, 42)
    for answer in ("66", "6.6", "x + 1", "66 + 1", "1e2", "", "9" * 40):  # right, or not a plain integer
        assert localised_hint(problem, Role.SOLVER, ErrorKind.WRONG_ANSWER, answer) is None
    assert localised_hint(problem, Role.SOLVER, ErrorKind.WRONG_ANSWER, None) is None
    assert localised_hint(problem, Role.VERIFIER, ErrorKind.FALSE_ACCEPT, "67") is None
    assert localised_hint(problem, Role.SOLVER, ErrorKind.MISSING_FINAL_ANSWER, "67") is None
    other = ProblemGenerator(families=["single_digit_sum"]).by_seed(3)
    assert localised_hint(other, Role.SOLVER, ErrorKind.WRONG_ANSWER, "100") is None


@pytest.mark.parametrize(("answer", "hint"), [
    ("66", "Your final answer 66 is not correct: its ones digit is wrong."),  # the ones step
    ("75", "Your final answer 75 is not correct: its tens digit is wrong."),  # the tens step
    ("56", "Your final answer 56 is not correct: its ones and tens digits are wrong."),
    ("65", None),  # right: 455 / 7
    ("6.5", None),
])
def test_a_wrong_quotient_s_hint_names_the_division_step_that_went_wrong(answer: str, hint: str | None) -> None:
    divisions = ProblemGenerator(families=["exact_division"])
    problem = next(p for p in map(divisions.by_seed, range(5_000)) if p.problem == "Compute $455 \\div 7$.")
    assert localised_hint(problem, Role.SOLVER, ErrorKind.WRONG_ANSWER, answer) == hint


def test_the_rewards_record_carries_each_wrong_turns_hint() -> None:
    problem = sum_problem(24, 42)
    episode = DebateEpisode("e", problem, max_rounds=2, max_action_chars=1000)
    for role, text in [("solver", r"\boxed{76}"), ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{67}")]:
        act(episode, role, text)
    grades = {t.t: Grade(False) for t in episode.turns if t.needs_grade}
    record = EpisodeRewards.model_validate(episode_rewards_data(episode, grades, graded_at=1.0, session_id="s"))
    solver, verifier, judge = record.turns
    assert solver.hint == localised_hint(problem, Role.SOLVER, ErrorKind.WRONG_ANSWER, "76")
    assert solver.hint == "Your final answer 76 is not correct: its tens digit is wrong."
    assert verifier.hint is None and verifier.error_kind is ErrorKind.FALSE_ACCEPT
    assert judge.hint == "Your final answer 67 is not correct: its ones digit is wrong."
