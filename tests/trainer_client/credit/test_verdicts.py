"""Verdict and repair figures from graded records (``trainer_client.credit.verdicts``), computed by
hand; and the same figures from the server's own records of real debates."""

from __future__ import annotations

import pytest
from records import make_record

from env_server.protocol.markers import ErrorKind
from trainer_client.credit.verdicts import first_verdict, verdict_figures, verifier_step_metrics


def _records():
    # (solver answers right?, verdicts said CORRECT?, judge right?)
    return [
        make_record([True], [True], True, "a"),            # right, accepted, kept
        make_record([True], [False], False, "b"),          # right, falsely rejected, judge breaks it: right->wrong
        make_record([False], [False], True, "c"),          # wrong, rejected, judge repairs: wrong->right
        make_record([False], [True], False, "d"),          # wrong, falsely accepted, stays wrong
        make_record([False], [None], True, "e"),           # wrong, no verdict, judge repairs: wrong->right
        make_record([False, True], [False, True], True, "f"),  # wrong, rejected, revised right, accepted
    ]


def test_figures_by_hand() -> None:
    figures = verdict_figures(_records())
    # verifier turns: a(R,acc) b(R,rej) c(W,rej) d(W,acc) e(W,missing) f(W,rej) f(R,acc)
    # right reviews: a, b, f2 -> accepts a, f2: 2/3; wrong reviews: c, d, e, f1 -> rejects c, f1: 2/4
    assert figures.verdict_accuracy_right == pytest.approx(2 / 3)
    assert figures.verdict_accuracy_wrong == pytest.approx(2 / 4)
    assert figures.balanced_verdict_accuracy == pytest.approx((2 / 3 + 2 / 4) / 2)
    assert figures.missing_verdict_share == pytest.approx(1 / 7)
    assert figures.verifier_turns == 7
    # wrong first answers: c, d, e, f (4); wrong->right: c, e, f (3); right->wrong: b (1)
    assert figures.wrong_first == 4
    assert figures.net_repair_rate == pytest.approx((3 - 1) / 4)
    # first verdicts on wrong first answers: c reject (repaired), d accept (not), e missing, f reject (repaired)
    assert figures.repair_when_rejected == pytest.approx(2 / 2)
    assert figures.repair_when_accepted == pytest.approx(0 / 1)
    assert [first_verdict(r) for r in _records()] == ["accept", "reject", "reject", "accept", "missing", "reject"]


def test_step_metrics_name_the_figures_and_leave_out_what_cannot_be_measured() -> None:
    metrics = verifier_step_metrics(_records())
    assert metrics == pytest.approx({"debate/verifier/balanced_accuracy": (2 / 3 + 2 / 4) / 2,
                                     "debate/verifier/accept_rate_right": 2 / 3,
                                     "debate/verifier/reject_rate_wrong": 2 / 4,
                                     "debate/verifier/missing_verdict_share": 1 / 7})
    only_right = verifier_step_metrics([make_record([True], [True], True)])  # no wrong answer reviewed
    assert set(only_right) == {"debate/verifier/accept_rate_right", "debate/verifier/missing_verdict_share"}
    assert verdict_figures([]).balanced_verdict_accuracy is None and verifier_step_metrics([]) == {}


def test_a_review_whose_grading_timed_out_is_left_out() -> None:
    record = make_record([False], [True], True)
    turns = list(record.turns)
    turns[1] = turns[1].model_copy(update={"error_kind": ErrorKind.GRADING_TIMEOUT, "correct": False})
    record = record.model_copy(update={"turns": turns})
    figures = verdict_figures([record])
    assert figures.verifier_turns == 0 and figures.verdict_accuracy_wrong is None
    assert first_verdict(record) is None and figures.wrong_first == 1 and figures.repair_when_accepted is None


@pytest.mark.parametrize("first_right", [True, False])
@pytest.mark.parametrize("said", ["VERDICT: CORRECT", "VERDICT: INCORRECT", "Looks fine to me.", "VERDICT: **incorrect**"])
def test_the_record_says_what_the_verifier_said(first_right: bool, said: str) -> None:
    """On the server's own debate and rewards rule (``DebateEpisode``, ``episode_rewards_data``),
    the verdict read back from the record is the one the verifier's text gave (``parse_verdict``)."""
    from env_server.debate.episode import DebateEpisode
    from env_server.debate.problems import load_problem_source
    from env_server.debate.rewards import episode_rewards_data
    from env_server.protocol.grades import Grade
    from env_server.protocol.markers import Role
    from env_server.protocol.models import DebateAction, EpisodeRewards
    from trainer_client.evaluation.heldout import grade_answer_text

    problem = load_problem_source("gen:single_digit_sum").by_seed(3)
    answer = problem.answer if first_right else f"{problem.answer}1"
    episode = DebateEpisode("ep", problem, max_rounds=1, max_action_chars=4096)
    for role, content in [(Role.SOLVER, f"So $\\boxed{{{answer}}}$."), (Role.VERIFIER, said),
                          (Role.JUDGE, f"$\\boxed{{{answer}}}$")]:
        episode.step(DebateAction(role=role, content=content))
    grades = {turn.t: Grade(grade_answer_text(problem.answer, turn.answer), None, "test")
              for turn in episode.turns if turn.needs_grade}
    record = EpisodeRewards.model_validate(episode_rewards_data(episode, grades, graded_at=0.0))
    spoken = episode.turns[1].verdict
    expected = {"CORRECT": "accept", "INCORRECT": "reject", None: "missing"}[spoken]
    assert first_verdict(record) == expected
    figures = verdict_figures([record])
    assert figures.missing_verdict_share == (spoken is None)
    assert (figures.verdict_accuracy_right if first_right else figures.verdict_accuracy_wrong) == (
        expected == ("accept" if first_right else "reject"))


def test_the_verification_gap_by_hand() -> None:
    """arXiv 2412.02674's gap, P(right | accepted) − p: p 0.5, accept right 0.8, reject wrong 0.6:
    accepted 0.5·0.8 + 0.5·0.4 = 0.6, of which 0.4 right, so 2/3 − 1/2 = 1/6. A verifier that
    accepts everything (or accepts at the same rate whatever the answer) has gap 0."""
    from trainer_client.credit.verdicts import verification_gap

    assert verification_gap(0.5, 0.8, 0.6) == pytest.approx(1 / 6)
    assert verification_gap(0.3, 1.0, 0.0) == pytest.approx(0.0)
    assert verification_gap(0.3, 0.7, 0.3) == pytest.approx(0.0)
    assert verification_gap(0.3, 1.0, 1.0) == pytest.approx(0.7)
    assert verification_gap(0.3, None, 1.0) is None and verification_gap(0.5, 0.0, 1.0) is None
