"""The result of grading one answer, and the exactness rule the grading policies share.

Its own module because everything from the episode store to the rewards builder needs
``Grade``, while only the server needs the process pool that produces most grades
(``grading.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from env_server.protocol.markers import ErrorKind

__all__ = ["EXACT_DIGITS", "Grade", "GradeSource"]

EXACT_DIGITS = 60
"""The grading policies' exactness rule: two exact numbers are equal when their difference is
zero at this many significant digits, and a plain number is read exactly only up to this many
digits (longer ones go to a grading worker). Used by the event-loop fast paths
(``closed_form``) and by the worker (``grading_worker``), which must agree."""

GradeSource = str
"""How a grade was decided: ``"rule"``, ``"exact"``, ``"numeric"``, ``"closed_form"``,
``"decorated"``, ``"cache"`` or ``"worker"`` (see :class:`Grade`)."""


@dataclass(frozen=True, slots=True)
class Grade:
    """Result of grading one answer.

    Attributes:
        correct: whether the answer is equivalent to the gold.
        error_kind: ``None``, or one of ``missing_final_answer``, ``unparseable_answer``,
            ``grading_timeout`` (a wrong but parsed answer has ``None`` here; the reward
            builder marks it ``wrong_answer``).
        source: how it was decided: ``"rule"``, ``"exact"`` (equal normal forms),
            ``"numeric"`` (both plain integers or integer fractions, compared exactly),
            ``"closed_form"`` (decided from closed-form values, ``closed_form.closed_form_verdict``),
            ``"decorated"`` (the plain number inside ``\\$18``, ``18 \\text{ dollars}``,
            ``x = 18`` or ``\\mathbf{18}``, ``closed_form.undecorated``, decided as above),
            ``"cache"`` or ``"worker"``.
    """

    correct: bool
    error_kind: ErrorKind | None = None
    source: GradeSource = "worker"
