"""Error-site markers: the closed vocabulary of error kinds and the hint templates.

Every step observation's ``metadata`` carries ``error_kind`` (``None`` when the turn has no
error) and ``hint_template_key``; the graded ``rewards`` record carries the final marker of
every turn. Markers are for the trainer only: they never appear in the text shown to a policy.

Kinds known when the action arrives (no grading needed) are *provisional* in the step
metadata; kinds that need the grader arrive with the delayed rewards. The per-turn markers in
the rewards record are authoritative (RFC 0002).

Hint template keys are ``"<role>/<error_kind>"`` (for example ``"solver/wrong_answer"``),
because the useful hint for a kind depends on who made the error. ``GET /hints`` serves the
whole table.
"""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """A debate role. The value is what goes on the wire."""

    SOLVER = "solver"
    VERIFIER = "verifier"
    JUDGE = "judge"


class EpisodeMode(str, Enum):
    """How an episode is played. The value is what goes on the wire (``reset(mode=...)``).

    - ``debate``: solver -> verifier -> (solver revises -> verifier)* -> judge.
    - ``single``: the solver answers once and the episode is graded on that answer; no
      verifier or judge turns.
    """

    DEBATE = "debate"
    SINGLE = "single"


class ErrorKind(str, Enum):
    """The closed vocabulary of error kinds (wire values are the lower-case names).

    Provisional at step time (decided without grading):
        - ``missing_final_answer``: a solver or judge turn without a ``\\boxed{...}``.
        - ``missing_verdict``: a verifier turn without ``VERDICT: CORRECT|INCORRECT``.
        - ``repeated_rejected_answer``: the solver re-submits an answer the verifier already
          rejected (same normalised text). Kept in the graded record only if that answer is
          wrong: standing by a correct answer after a false rejection is not an error. With
          the circular-critique stop on (the server's default) the debate then goes to the judge
          at once.
        - ``circular_critique``: the verifier's review repeats its previous review (same text
          once case-folded and whitespace-collapsed); with the circular-critique stop on, the
          debate goes to the judge at once. In the graded record a graded verifier error of the
          turn (``false_reject``, ``grading_timeout``) and ``missing_verdict`` take precedence.
    Rejected actions (the episode does not advance; the error frame carries the kind):
        - ``role_mismatch``: the action's role is not the role whose turn it is.
        - ``empty_response``: empty or whitespace-only content.
        - ``too_long``: content longer than the server's ``max_action_chars``.
    Decided by grading (arrive with the delayed rewards):
        - ``unparseable_answer``: a boxed answer that math-verify cannot parse, or one over the
          answer-size cap.
        - ``wrong_answer``: a parsed answer that is not equivalent to the reference.
        - ``false_accept``: the verifier said CORRECT about a wrong (or missing) answer.
        - ``false_reject``: the verifier said INCORRECT about a correct answer.
        - ``grading_timeout``: the grader was killed at the hard wall-clock limit; the turn
          (and a verifier turn judging it) gets reward 0.
    """

    MISSING_FINAL_ANSWER = "missing_final_answer"
    UNPARSEABLE_ANSWER = "unparseable_answer"
    WRONG_ANSWER = "wrong_answer"
    MISSING_VERDICT = "missing_verdict"
    FALSE_ACCEPT = "false_accept"
    FALSE_REJECT = "false_reject"
    REPEATED_REJECTED_ANSWER = "repeated_rejected_answer"
    CIRCULAR_CRITIQUE = "circular_critique"
    ROLE_MISMATCH = "role_mismatch"
    EMPTY_RESPONSE = "empty_response"
    TOO_LONG = "too_long"
    GRADING_TIMEOUT = "grading_timeout"


_BOX = "Put only the final answer inside \\boxed{...}, at the end of your response."
_VERDICT = "End your review with exactly one line: VERDICT: CORRECT or VERDICT: INCORRECT."

#: Hint templates, key -> text. A hint is inserted before the erring turn in the teacher
#: context of hint distillation (SDPO); it names the failure without giving the answer away.
HINT_TEMPLATES: dict[str, str] = {
    "solver/missing_final_answer": f"Your previous attempt gave no final answer. {_BOX}",
    "solver/unparseable_answer": (
        "Your final answer could not be read as a mathematical expression. Write it as a plain "
        f"number, expression, set or tuple in LaTeX, without words. {_BOX}"
    ),
    "solver/wrong_answer": (
        "Your final answer is not correct. Re-derive the result step by step, check each "
        f"computation, and state the corrected answer. {_BOX}"
    ),
    "solver/repeated_rejected_answer": (
        "You repeated an answer that was already rejected and that is wrong. Find the error in "
        f"the earlier reasoning instead of restating it. {_BOX}"
    ),
    "solver/grading_timeout": (
        f"Your final answer was too complex to check. Simplify it to a closed form. {_BOX}"
    ),
    "solver/role_mismatch": "It is the solver's turn: answer as the solver.",
    "solver/empty_response": f"Your response was empty. Solve the problem. {_BOX}",
    "solver/too_long": f"Your response was too long. Be concise. {_BOX}",
    "verifier/missing_verdict": f"Your review gave no verdict. {_VERDICT}",
    "verifier/false_accept": (
        "The answer you accepted is wrong. Recompute the result independently before judging, "
        f"and do not accept an answer you have not checked. {_VERDICT}"
    ),
    "verifier/false_reject": (
        "The answer you rejected is correct. Check the solution's steps carefully and only "
        f"reject it when you can point to a concrete error. {_VERDICT}"
    ),
    "verifier/circular_critique": (
        "Your review repeated your previous review. Check the revised solution itself and point "
        f"to a concrete error in it, or accept it if it is right. {_VERDICT}"
    ),
    "verifier/grading_timeout": (
        f"The answer under review could not be checked in time; judge its steps. {_VERDICT}"
    ),
    "verifier/role_mismatch": "It is the verifier's turn: review the solution as the verifier.",
    "verifier/empty_response": f"Your review was empty. {_VERDICT}",
    "verifier/too_long": f"Your review was too long. Be concise. {_VERDICT}",
    "judge/missing_final_answer": f"Your decision gave no final answer. {_BOX}",
    "judge/unparseable_answer": f"Your final answer could not be read. {_BOX}",
    "judge/wrong_answer": (
        "The final answer you chose is wrong. Weigh the verifier's critique against the "
        f"solver's steps before deciding. {_BOX}"
    ),
    "judge/grading_timeout": f"Your final answer was too complex to check. {_BOX}",
    "judge/role_mismatch": "It is the judge's turn: give the final decision as the judge.",
    "judge/empty_response": f"Your decision was empty. {_BOX}",
    "judge/too_long": f"Your decision was too long. Be concise. {_BOX}",
}

#: (role, kind) -> its key in ``HINT_TEMPLATES``, for the pairs that have a template: the
#: lookup every step and every graded turn makes, without formatting a string each time
_HINT_KEYS: dict[tuple[Role, ErrorKind], str] = {
    (role, kind): f"{role.value}/{kind.value}"
    for role in Role for kind in ErrorKind if f"{role.value}/{kind.value}" in HINT_TEMPLATES
}


def hint_key(role: Role | str, kind: ErrorKind | str | None) -> str | None:
    """Return the hint template key for an error of ``kind`` made by ``role``.

    Args:
        role: the role that made the error.
        kind: the error kind, or ``None`` for no error.

    Returns:
        ``"<role>/<kind>"`` when a template exists, else ``None`` (no error, or a kind that
        cannot occur for that role, e.g. ``verifier/wrong_answer``).
    """
    if kind is None:
        return None
    return _HINT_KEYS.get((Role(role), ErrorKind(kind)))
