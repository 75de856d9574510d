"""The text each role sees: system instructions and the chat built from the transcript.

Markers and grades never enter these messages: only the problem and what the debaters said.
"""

from __future__ import annotations

from collections.abc import Sequence

from env_server.protocol.markers import Role

SYSTEM_PROMPTS: dict[Role, str] = {
    Role.SOLVER: (
        "You are the solver in a math debate. Solve the problem step by step. End with the "
        "final answer inside \\boxed{...}. If a verifier criticises your solution, check the "
        "criticism; fix real errors and keep a correct answer."
    ),
    Role.VERIFIER: (
        "You are the verifier in a math debate. Check the proposed solution step by step and "
        "point out any error. End your review with exactly one line: "
        "VERDICT: CORRECT or VERDICT: INCORRECT."
    ),
    Role.JUDGE: (
        "You are the judge of a math debate. Read the problem and the debate, decide which "
        "answer is right, and give the final answer inside \\boxed{...}."
    ),
}

SINGLE_SOLVER_PROMPT = (
    "Solve the math problem step by step. End with the final answer inside \\boxed{...}."
)
"""The solver's system prompt in ``single`` mode: one answer, no verifier, no debate."""

REVISE_REQUEST = "Revise your solution in light of this review. End with the final answer inside \\boxed{...}."


#: "[Solver, round 1]": each role's name as the judge reads it
_ROLE_TITLES: dict[Role, str] = {role: role.value.capitalize() for role in Role}


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def solver_messages(problem: str, solver_turns: Sequence[str], reviews: Sequence[str]) -> list[dict[str, str]]:
    """Chat for the solver's next turn: earlier attempts are its own (``assistant``) messages
    and each review comes back as a ``user`` message asking for a revision.

    Args:
        problem: the problem statement.
        solver_turns: the solver's earlier turns, oldest first.
        reviews: the verifier's reviews of those turns (same length).
    """
    messages = [_msg("system", SYSTEM_PROMPTS[Role.SOLVER]), _msg("user", problem)]
    for attempt, review in zip(solver_turns, reviews, strict=True):
        messages.append(_msg("assistant", attempt))
        messages.append(_msg("user", f"A verifier reviewed your solution:\n\n{review}\n\n{REVISE_REQUEST}"))
    return messages


def single_solver_messages(problem: str) -> list[dict[str, str]]:
    """Chat for the solver's one turn in ``single`` mode: the system prompt and the problem."""
    return [_msg("system", SINGLE_SOLVER_PROMPT), _msg("user", problem)]


def verifier_messages(problem: str, solver_turns: Sequence[str], reviews: Sequence[str]) -> list[dict[str, str]]:
    """Chat for the verifier's next turn: the first solution in the opening ``user`` message,
    its own earlier reviews as ``assistant`` messages, each revision as a ``user`` message.

    Args:
        problem: the problem statement.
        solver_turns: every solver turn so far (the last one is under review).
        reviews: the verifier's earlier reviews (one fewer than ``solver_turns``).
    """
    messages = [
        _msg("system", SYSTEM_PROMPTS[Role.VERIFIER]),
        _msg("user", f"Problem:\n{problem}\n\nProposed solution:\n{solver_turns[0]}"),
    ]
    for review, revision in zip(reviews, solver_turns[1:], strict=True):
        messages.append(_msg("assistant", review))
        messages.append(_msg("user", f"Revised solution:\n{revision}"))
    return messages


def judge_messages(problem: str, transcript: Sequence[tuple[Role, int, str]]) -> list[dict[str, str]]:
    """Chat for the judge: the problem and the whole debate in one ``user`` message.

    Args:
        problem: the problem statement.
        transcript: ``(role, round, content)`` for every turn so far.
    """
    debate = "\n\n".join(
        f"[{_ROLE_TITLES[role]}, round {rnd + 1}]\n{content}" for role, rnd, content in transcript
    )
    return [
        _msg("system", SYSTEM_PROMPTS[Role.JUDGE]),
        _msg("user", f"Problem:\n{problem}\n\nDebate:\n{debate}\n\nGive the final answer."),
    ]
