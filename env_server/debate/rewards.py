"""From a finished debate and its grades to the delayed-reward record (RFC 0003).

Per turn: a solver turn earns the correctness of its answer (1/0); a verifier turn earns 1 when
its verdict matches the true correctness of the answer it reviewed; a judge turn earns 0 (judge
accuracy is a metric only). The episode reward is the correctness of the final answer: the
judge's boxed answer, or the solver's last answer when the judge boxed none.

In ``single`` mode the record has the one solver turn; the episode reward is that answer's
correctness, and the facts have no verifier or judge (``verifier_accepted`` and
``judge_correct`` are ``None``, ``rounds`` is 0, per-role facts name the solver only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from env_server.debate.episode import DebateEpisode, TurnRecord
from env_server.debate.error_sites import localised_hint
from env_server.protocol.grades import Grade
from env_server.protocol.markers import EpisodeMode, ErrorKind, Role, hint_key

__all__ = ["episode_rewards_data"]


def _answer_kind(turn: TurnRecord, grade: Grade) -> ErrorKind | None:
    if grade.correct:
        return None
    if grade.error_kind is not None:
        return grade.error_kind
    if turn.provisional_kind is ErrorKind.REPEATED_REJECTED_ANSWER:
        return ErrorKind.REPEATED_REJECTED_ANSWER
    return ErrorKind.WRONG_ANSWER


def _verifier_kind(turn: TurnRecord, reviewed: Grade) -> tuple[bool, ErrorKind | None]:
    """(verdict correct, marker) for a verifier turn given the grade of the reviewed answer."""
    if turn.verdict is None:
        return False, ErrorKind.MISSING_VERDICT
    if reviewed.error_kind is ErrorKind.GRADING_TIMEOUT:
        return False, ErrorKind.GRADING_TIMEOUT  # the truth is unknown: no credit, no blame
    said_correct = turn.verdict == "CORRECT"
    if said_correct == reviewed.correct:
        # a right verdict that repeats the previous review word for word keeps that marker
        return True, ErrorKind.CIRCULAR_CRITIQUE if turn.circular else None
    return False, ErrorKind.FALSE_ACCEPT if said_correct else ErrorKind.FALSE_REJECT


def _raise_missing(episode: DebateEpisode, grades: Mapping[int, Grade]) -> NoReturn:
    missing = [t.t for t in episode.turns if t.needs_grade and t.t not in grades]
    raise ValueError(f"episode {episode.episode_id}: no grade for turns {missing}")


def episode_rewards_data(
    episode: DebateEpisode, grades: Mapping[int, Grade], graded_at: float, session_id: str | None = None
) -> dict[str, Any]:
    """The rewards record as plain JSON data, valid for :class:`~env_server.protocol.models.EpisodeRewards`
    (``tests/env_server/service/test_hot_paths.py`` checks it against the validated model).

    The server builds this form and serialises it once with orjson, several times cheaper than
    building and dumping the validated model (figures: ``benchmarks/README.md``). The model is
    built only where a route needs it.

    Raises:
        ValueError: the debate is not over, or a solver/judge turn has no grade.
    """
    if not episode.done:
        raise ValueError(f"episode {episode.episode_id} is not over")
    turns: list[dict[str, Any]] = []
    solver_rewards: list[float] = []
    verifier_rewards: list[float] = []
    circular = False
    for turn in episode.turns:
        circular = circular or turn.circular
        if turn.role is Role.VERIFIER:
            assert turn.reviewed_t is not None
            reviewed = grades.get(turn.reviewed_t)
            if reviewed is None:
                _raise_missing(episode, grades)
            correct, kind = _verifier_kind(turn, reviewed)
            reward, answer = float(correct), None
            verifier_rewards.append(reward)
        else:
            grade = grades.get(turn.t)
            if grade is None:
                _raise_missing(episode, grades)
            correct, kind, answer = grade.correct, _answer_kind(turn, grade), turn.answer
            reward = float(correct) if turn.role is Role.SOLVER else 0.0
            if turn.role is Role.SOLVER:
                solver_rewards.append(reward)
        # enum members, not ``.value`` (a slow property on CPython 3.11): orjson writes a member as its value;
        # the hint helpers are called only where they can answer something other than None
        turns.append({"t": turn.t, "role": turn.role, "reward": reward, "error_kind": kind,
                      "hint_template_key": None if kind is None else hint_key(turn.role, kind),
                      "answer": answer, "correct": correct,
                      "hint": localised_hint(episode.problem, turn.role, kind, answer)
                      if kind is ErrorKind.WRONG_ANSWER else None})

    first_correct = solver_rewards[0] == 1.0
    last_solver_correct = solver_rewards[-1] == 1.0
    facts: dict[str, Any]
    if episode.mode is EpisodeMode.SINGLE:
        final_correct = first_correct
        facts = {
            "first_answer_correct": first_correct,
            "last_solver_answer_correct": last_solver_correct,
            "final_answer_correct": final_correct,
            "judge_correct": None,
            "verifier_accepted": None,
            "rounds": 0,
            "local_rewards": {"solver": solver_rewards[0]},
            "rewards_without_role": {"solver": 0.0},
            "circular_critique": False,
        }
    else:
        judge_turn = episode.turns[-1]
        judge_correct = None if judge_turn.answer is None else grades[judge_turn.t].correct
        final_correct = last_solver_correct if judge_correct is None else judge_correct
        facts = {
            "first_answer_correct": first_correct,
            "last_solver_answer_correct": last_solver_correct,
            "final_answer_correct": final_correct,
            "judge_correct": judge_correct,
            "verifier_accepted": episode.accepted,
            "rounds": len(solver_rewards),
            "local_rewards": {
                "solver": sum(solver_rewards) / len(solver_rewards),
                "verifier": sum(verifier_rewards) / len(verifier_rewards),
                "judge": float(bool(judge_correct)),
            },
            "rewards_without_role": {
                "solver": 0.0,
                "verifier": float(first_correct),
                "judge": float(last_solver_correct),
            },
            "circular_critique": circular,
        }
    return {
        "episode_id": episode.episode_id,
        "session_id": session_id,
        "problem_id": episode.problem.problem_id,
        "turns": turns,
        "episode_reward": float(final_correct),
        "facts": facts,
        "graded_at": graded_at,
        "mode": episode.mode,
    }
