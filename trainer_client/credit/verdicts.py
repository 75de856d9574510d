"""The verifier's verdicts and what the debate did to wrong first answers, read from graded records:
one definition for the per-step training metrics (``debate/verifier/...``) and the held-out and
validation evaluations (``balanced_verdict_accuracy``, ``missing_verdict_share``,
``net_repair_rate``, ...).

A record does not carry the verdict's word; its verifier turn carries whether the verdict was right
(``correct``) and the marker (``error_kind``), and the reviewed answer is the solver turn before it
(the server's ``reviewed_t``). So a verifier turn is:

- *missing* when its marker is ``missing_verdict`` (no parsable ``VERDICT:`` line, a forfeit);
- left out when its marker is ``grading_timeout`` (the reviewed answer's truth is unknown);
- otherwise an *accept* when (verdict right) equals (reviewed answer right), else a *reject*.

A missing verdict counts in the denominator of its class and as neither accept nor reject, so it
lowers both rates (what ``evaluate_episodes`` has always done); ``missing_verdict_share`` says how
much of a low balanced accuracy is missing verdicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

from env_server.protocol.markers import ErrorKind, Role
from env_server.protocol.models import EpisodeRewards

__all__ = ["VerdictFigures", "first_verdict", "reviewed_verdicts", "verdict_figures", "verification_gap",
           "verifier_step_metrics"]

Verdict = Literal["accept", "reject", "missing"]


@dataclass(frozen=True)
class VerdictFigures:
    """Verdicts and repairs over a set of graded debates (fractions in [0, 1], ``None`` where the
    denominator is empty).

    Attributes:
        verdict_accuracy_right: accepts among verifier turns reviewing a right answer.
        verdict_accuracy_wrong: rejects among verifier turns reviewing a wrong answer.
        balanced_verdict_accuracy: their mean (``None`` unless both are known): 0.5 for a verifier
            that always gives the same verdict, whatever the solver's accuracy.
        missing_verdict_share: verifier turns without a parsable verdict, over all verifier turns
            (those reviewing an answer whose grading timed out left out).
        net_repair_rate: ``(wrong→right − right→wrong) / wrong first answers``, over debates
            (``wrong→right``: first answer wrong and final right).
        repair_when_rejected: among debates whose first answer was wrong and whose first verdict
            rejected it, the share whose final answer is right.
        repair_when_accepted: the same where the first verdict accepted the wrong answer.
        verifier_turns: verifier turns counted (an ``int``).
        wrong_first: debates whose first answer was wrong (an ``int``).
    """

    verdict_accuracy_right: float | None
    verdict_accuracy_wrong: float | None
    balanced_verdict_accuracy: float | None
    missing_verdict_share: float | None
    net_repair_rate: float | None
    repair_when_rejected: float | None
    repair_when_accepted: float | None
    verifier_turns: int
    wrong_first: int

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def reviewed_verdicts(record: EpisodeRewards) -> list[tuple[int, bool, Verdict]]:
    """``(t, reviewed answer right, verdict)`` of each verifier turn of ``record`` with a known
    reviewed answer (not ``grading_timeout``), in order (see the module docstring)."""
    out: list[tuple[int, bool, Verdict]] = []
    reviewed: bool | None = None
    for turn in record.turns:
        if turn.role is Role.SOLVER:
            reviewed = bool(turn.correct)
        elif turn.role is Role.VERIFIER and reviewed is not None and turn.error_kind is not ErrorKind.GRADING_TIMEOUT:
            verdict: Verdict = ("missing" if turn.error_kind is ErrorKind.MISSING_VERDICT
                                else "accept" if bool(turn.correct) == reviewed else "reject")
            out.append((turn.t, reviewed, verdict))
    return out


def _verdicts(record: EpisodeRewards) -> list[tuple[bool, Verdict]]:
    """``(reviewed answer right, verdict)`` of each verifier turn of ``record``, in order."""
    return [(right, verdict) for _, right, verdict in reviewed_verdicts(record)]


def first_verdict(record: EpisodeRewards) -> Verdict | None:
    """The verdict on the solver's first answer: the debate's first verifier turn, which reviews it
    (``None``: no verifier turn, as in ``single`` mode, or its reviewed answer's grading timed out)."""
    first = next((turn for turn in record.turns if turn.role is Role.VERIFIER), None)
    if first is None or first.error_kind is ErrorKind.GRADING_TIMEOUT:
        return None
    return _verdicts(record)[0][1]


def _share(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def verdict_figures(records: Iterable[EpisodeRewards]) -> VerdictFigures:
    """:class:`VerdictFigures` of the debates ``records`` (``single``-mode records add nothing but
    their repair counts, which are zero: their final answer is their first)."""
    right_reviews = wrong_reviews = accepted_right = rejected_wrong = missing = turns = 0
    wrong_first = wrong_to_right = right_to_wrong = 0
    by_verdict: dict[Verdict, list[int]] = {"accept": [0, 0], "reject": [0, 0], "missing": [0, 0]}
    for record in records:
        for reviewed, verdict in _verdicts(record):
            turns += 1
            missing += verdict == "missing"
            if reviewed:
                right_reviews += 1
                accepted_right += verdict == "accept"
            else:
                wrong_reviews += 1
                rejected_wrong += verdict == "reject"
        first, final = record.facts.first_answer_correct, record.facts.final_answer_correct
        wrong_to_right += (not first) and final
        right_to_wrong += first and not final
        if not first:
            wrong_first += 1
            reviewed_first = first_verdict(record)
            if reviewed_first is not None:
                by_verdict[reviewed_first][0] += 1
                by_verdict[reviewed_first][1] += bool(final)
    right_rate, wrong_rate = _share(accepted_right, right_reviews), _share(rejected_wrong, wrong_reviews)
    return VerdictFigures(
        verdict_accuracy_right=right_rate, verdict_accuracy_wrong=wrong_rate,
        balanced_verdict_accuracy=(right_rate + wrong_rate) / 2
        if right_rate is not None and wrong_rate is not None else None,
        missing_verdict_share=_share(missing, turns),
        net_repair_rate=(wrong_to_right - right_to_wrong) / wrong_first if wrong_first else None,
        repair_when_rejected=_share(by_verdict["reject"][1], by_verdict["reject"][0]),
        repair_when_accepted=_share(by_verdict["accept"][1], by_verdict["accept"][0]),
        verifier_turns=turns, wrong_first=wrong_first)


def verifier_step_metrics(records: Iterable[EpisodeRewards]) -> dict[str, float]:
    """The training step's ``debate/verifier/...`` metrics (the figures that can be measured):
    ``balanced_accuracy``, ``accept_rate_right``, ``reject_rate_wrong``, ``missing_verdict_share``."""
    figures = verdict_figures(records)
    named = {"debate/verifier/balanced_accuracy": figures.balanced_verdict_accuracy,
             "debate/verifier/accept_rate_right": figures.verdict_accuracy_right,
             "debate/verifier/reject_rate_wrong": figures.verdict_accuracy_wrong,
             "debate/verifier/missing_verdict_share": figures.missing_verdict_share}
    return {name: float(value) for name, value in named.items() if value is not None}


def verification_gap(accuracy: float, accept_right: float | None, reject_wrong: float | None) -> float | None:
    """The generator-verifier gap as the precision of the model's own verification over its
    generation (Song et al. 2024, "Mind the Gap", arXiv 2412.02674: the gain of filtering
    generations by self-verification): ``P(right | accepted) − p`` with
    ``P(right | accepted) = p·a / (p·a + (1 − p)·(1 − r))``, for first-answer accuracy ``p``, accept
    rate on right answers ``a`` and reject rate on wrong ones ``r`` (fractions). 0: an accept says
    nothing about being right; ``1 − p`` at most (every accepted answer right).

    Returns:
        The gap (a fraction, possibly negative), or ``None`` where a rate is ``None`` or nothing
        would be accepted.
    """
    if accept_right is None or reject_wrong is None:
        return None
    accepted = accuracy * accept_right + (1 - accuracy) * (1 - reject_wrong)
    return None if accepted == 0 else accuracy * accept_right / accepted - accuracy
