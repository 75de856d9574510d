"""Localised hints: where in a wrong answer the error is, for problem families that can say it.

The hint templates (:data:`env_server.protocol.markers.HINT_TEMPLATES`) name the failure only
("your final answer is not correct"). A family whose answers are built step by step can also
say *where* a wrong answer goes wrong, from the reference answer, without giving the answer:
for ``two_digit_sum`` and ``exact_division`` which digits of the answer are wrong (its ones,
its tens), so that the rest of it can be kept. The hint quotes the turn's own answer (a plain integer; the server
never echoes other model output). The rewards record carries it per turn
(``TurnReward.hint``, RFC 0002 §"Localised hints"), and hint distillation (SDPO) puts it in the
teacher context in place of the template.

Why: the starting policy of the CPU protocol (``tiny-sums``) errs by copying a digit of the
problem wrongly; a hint that names only the failure carries nothing it can use, and shown that
hint it answered worse, not better (``docs/ablation/tiny-sums-validation/README.md``).

Safety: the answer is model output; it is only matched against a digits-only pattern, never
parsed as an expression.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from env_server.debate.problems.base import Problem
from env_server.protocol.markers import ErrorKind, Role

__all__ = ["LOCALISERS", "localised_hint"]

_SUM = re.compile(r"Compute \$(\d{2}) \+ (\d{2})\$\.")
_DIVISION = re.compile(r"Compute \$(\d{2,3}) \\div (\d)\$\.")
_INTEGER = re.compile(r"\s*(\d{1,6})\s*")


def _digits_hint(value: int, right: int) -> str | None:
    """The hint naming which digits of ``value`` differ from ``right``'s: the ones digit, the
    tens digits (tens and above, as one); ``None`` when neither does."""
    wrong = [name for name, differs in (("ones", value % 10 != right % 10), ("tens", value // 10 != right // 10))
             if differs]
    if not wrong:
        return None
    digits = "digit is" if len(wrong) == 1 else "digits are"
    return f"Your final answer {value} is not correct: its {' and '.join(wrong)} {digits} wrong."


def _two_digit_sum(problem: Problem, answer: str) -> str | None:
    """Which digits of a ``two_digit_sum`` answer are wrong: the ones digit when it differs
    from the reference's, the tens digits (tens with the carry, and hundreds) when they do."""
    statement = _SUM.fullmatch(problem.problem)
    given = _INTEGER.fullmatch(answer)
    if statement is None or given is None:
        return None
    return _digits_hint(int(given.group(1)), int(statement.group(1)) + int(statement.group(2)))


def _exact_division(problem: Problem, answer: str) -> str | None:
    """Which digits of an ``exact_division`` quotient are wrong (its ones, its tens): each is one
    step of the long division, so the hint names the step that went wrong."""
    statement = _DIVISION.fullmatch(problem.problem)
    given = _INTEGER.fullmatch(answer)
    if statement is None or given is None:
        return None
    dividend, divisor = int(statement.group(1)), int(statement.group(2))
    return _digits_hint(int(given.group(1)), dividend // divisor)


#: Family name (a generator problem's ``subject``) -> ``f(problem, answer) -> hint or None``.
LOCALISERS: dict[str, Callable[[Problem, str], str | None]] = {"two_digit_sum": _two_digit_sum,
                                                                "exact_division": _exact_division}


def localised_hint(problem: Problem, role: Role | str, kind: ErrorKind | str | None, answer: str | None) -> str | None:
    """The localised hint for a wrong answer, or ``None`` where the family cannot localise it.

    Args:
        problem: the episode's problem (its family is ``problem.subject`` for generator problems).
        role: the role of the turn; only solver and judge answers are localised.
        kind: the turn's final error kind; only ``wrong_answer`` is localised.
        answer: the turn's extracted final answer (model output: matched, never parsed).

    Returns:
        The hint text, or ``None``.
    """
    if kind is None or ErrorKind(kind) is not ErrorKind.WRONG_ANSWER or Role(role) is Role.VERIFIER:
        return None
    localise = LOCALISERS.get(problem.subject or "") if problem.source == "generator" else None
    if localise is None or answer is None:
        return None
    return localise(problem, answer)
