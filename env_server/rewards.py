"""From a finished debate and its grades to the delayed-reward record (RFC 0003).

Per turn: a solver turn earns the correctness of its answer (1/0); a verifier turn earns 1 when
its verdict matches the true correctness of the answer it reviewed; a judge turn earns 0 (judge
accuracy is a metric only). The episode reward is the correctness of the final answer: the
judge's boxed answer, or the solver's last answer when the judge boxed none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from env_server.debate import DebateEpisode, TurnRecord
from env_server.grading import Grade
from env_server.markers import ErrorKind, Role, hint_key
from env_server.models import CounterfactualFacts, EpisodeRewards, TurnReward

__all__ = ["build_episode_rewards", "record_json"]


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
        return True, None
    return False, ErrorKind.FALSE_ACCEPT if said_correct else ErrorKind.FALSE_REJECT


def build_episode_rewards(
    episode: DebateEpisode, grades: Mapping[int, Grade], graded_at: float, session_id: str | None = None
) -> EpisodeRewards:
    """Build the rewards record of a finished debate.

    Args:
        episode: a debate with ``done`` True.
        grades: the grade of every solver and judge turn, by turn index ``t``.
        graded_at: Unix time (s) grading finished.
        session_id: the session that played the episode, if any.

    Raises:
        ValueError: the debate is not over, or a solver/judge turn has no grade.
    """
    if not episode.done:
        raise ValueError(f"episode {episode.episode_id} is not over")
    missing = [t.t for t in episode.turns if t.needs_grade and t.t not in grades]
    if missing:
        raise ValueError(f"episode {episode.episode_id}: no grade for turns {missing}")

    turns: list[TurnReward] = []
    for turn in episode.turns:
        if turn.role is Role.VERIFIER:
            assert turn.reviewed_t is not None
            correct, kind = _verifier_kind(turn, grades[turn.reviewed_t])
            reward, answer = float(correct), None
        else:
            grade = grades[turn.t]
            correct, kind, answer = grade.correct, _answer_kind(turn, grade), turn.answer
            reward = float(correct) if turn.role is Role.SOLVER else 0.0
        # model_construct: every value here is produced by this module with the declared type,
        # so pydantic's validation would only re-check it (it was a third of the cost of a
        # cached-grade episode on the server); tests compare with validated models.
        turns.append(
            TurnReward.model_construct(t=turn.t, role=turn.role, reward=reward, error_kind=kind,
                                       hint_template_key=hint_key(turn.role, kind), answer=answer, correct=correct)
        )

    solver = [r for r in turns if r.role is Role.SOLVER]
    verifier = [r for r in turns if r.role is Role.VERIFIER]
    judge_turn = episode.turns[-1]
    judge_grade = grades[judge_turn.t]
    last_solver_correct = bool(solver[-1].correct)
    judge_correct = None if judge_turn.answer is None else judge_grade.correct
    final_correct = last_solver_correct if judge_correct is None else judge_correct
    facts = CounterfactualFacts.model_construct(
        first_answer_correct=bool(solver[0].correct),
        last_solver_answer_correct=last_solver_correct,
        final_answer_correct=final_correct,
        judge_correct=judge_correct,
        verifier_accepted=episode.accepted,
        rounds=len(solver),
        local_rewards={
            Role.SOLVER: sum(r.reward for r in solver) / len(solver),
            Role.VERIFIER: sum(r.reward for r in verifier) / len(verifier),
            Role.JUDGE: float(bool(judge_correct)),
        },
        rewards_without_role={
            Role.SOLVER: 0.0,
            Role.VERIFIER: float(bool(solver[0].correct)),
            Role.JUDGE: float(last_solver_correct),
        },
    )
    return EpisodeRewards.model_construct(
        episode_id=episode.episode_id,
        session_id=session_id,
        problem_id=episode.problem.problem_id,
        turns=turns,
        episode_reward=float(final_correct),
        facts=facts,
        graded_at=graded_at,
    )


def _role_map(values: dict[Role, float]) -> dict[str, float]:
    return {role.value: value for role, value in values.items()}


def record_json(record: EpisodeRewards) -> bytes:
    """``record.model_dump_json()``'s content (same keys and values), built with orjson.

    pydantic's serializer costs about 18 us per record, several times this; the server
    serialises each record once (for the push, pulls and the trajectory log).
    ``tests/test_rewards_json.py`` checks equality with ``model_dump(mode="json")``.
    """
    facts = record.facts
    body: dict[str, Any] = {
        "episode_id": record.episode_id,
        "session_id": record.session_id,
        "problem_id": record.problem_id,
        "turns": [
            {"t": r.t, "role": r.role.value, "reward": r.reward,
             "error_kind": None if r.error_kind is None else r.error_kind.value,
             "hint_template_key": r.hint_template_key, "answer": r.answer, "correct": r.correct}
            for r in record.turns
        ],
        "episode_reward": record.episode_reward,
        "facts": {
            "first_answer_correct": facts.first_answer_correct,
            "last_solver_answer_correct": facts.last_solver_answer_correct,
            "final_answer_correct": facts.final_answer_correct,
            "judge_correct": facts.judge_correct,
            "verifier_accepted": facts.verifier_accepted,
            "rounds": facts.rounds,
            "local_rewards": _role_map(facts.local_rewards),
            "rewards_without_role": _role_map(facts.rewards_without_role),
        },
        "graded_at": record.graded_at,
    }
    return orjson.dumps(body)
