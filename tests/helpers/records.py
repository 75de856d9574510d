"""Graded debate records built by hand, as the server builds them, for the credit tests."""

from __future__ import annotations

from collections.abc import Sequence

from env_server.protocol.markers import ErrorKind, Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward


def make_record(
    solver: Sequence[bool | None],
    verdicts: Sequence[bool | None],
    judge: bool | None,
    episode_id: str = "ep",
) -> EpisodeRewards:
    """A graded debate as the server builds it (env_server/debate/rewards.py semantics).

    ``solver[k]``: correctness of the k-th solver answer (``None``: no boxed answer).
    ``verdicts[k]``: the k-th verifier said CORRECT (True), INCORRECT (False) or nothing (None).
    ``judge``: correctness of the judge's boxed answer (``None``: none boxed).
    """
    assert len(solver) == len(verdicts) >= 1
    turns: list[TurnReward] = []
    for answer_ok, verdict in zip(solver, verdicts, strict=True):
        correct = bool(answer_ok)
        kind = None if correct else (ErrorKind.MISSING_FINAL_ANSWER if answer_ok is None else ErrorKind.WRONG_ANSWER)
        turns.append(TurnReward(t=len(turns), role=Role.SOLVER, reward=float(correct), error_kind=kind,
                                correct=correct))
        verdict_ok = verdict is not None and verdict == correct
        vkind = (ErrorKind.MISSING_VERDICT if verdict is None else None if verdict_ok
                 else ErrorKind.FALSE_ACCEPT if verdict else ErrorKind.FALSE_REJECT)
        turns.append(TurnReward(t=len(turns), role=Role.VERIFIER, reward=float(verdict_ok), error_kind=vkind,
                                correct=verdict_ok))
    jkind = ErrorKind.MISSING_FINAL_ANSWER if judge is None else None if judge else ErrorKind.WRONG_ANSWER
    turns.append(TurnReward(t=len(turns), role=Role.JUDGE, reward=0.0, error_kind=jkind, correct=judge))
    solver_turns = [t for t in turns if t.role is Role.SOLVER]
    verifier_turns = [t for t in turns if t.role is Role.VERIFIER]
    last = bool(solver[-1])
    final = last if judge is None else judge
    facts = CounterfactualFacts(
        first_answer_correct=bool(solver[0]),
        last_solver_answer_correct=last,
        final_answer_correct=final,
        judge_correct=judge,
        verifier_accepted=verdicts[-1] is True,
        rounds=len(solver),
        local_rewards={
            Role.SOLVER: sum(t.reward for t in solver_turns) / len(solver_turns),
            Role.VERIFIER: sum(t.reward for t in verifier_turns) / len(verifier_turns),
            Role.JUDGE: float(bool(judge)),
        },
        rewards_without_role={Role.SOLVER: 0.0, Role.VERIFIER: float(bool(solver[0])), Role.JUDGE: float(last)},
    )
    return EpisodeRewards(episode_id=episode_id, problem_id="p", turns=turns, episode_reward=float(final),
                          facts=facts, graded_at=0.0)


def per_role_normalize(values, roles, group_ids, scale: bool = True):
    """GRPO's per-(group, role) normalisation exactly as ``credit.pipeline`` runs it: the one
    ``group_norm.group_normalize`` over ``role_samples.role_group_keys``, TRL's eps, lone samples 0,
    in the dtype of ``values``."""
    import numpy as np

    from trainer_client.credit.group_norm import GRPO_EPS, group_normalize
    from trainer_client.credit.role_samples import role_group_keys

    values = np.asarray(values)
    return group_normalize(values, role_group_keys(roles, group_ids), scale=scale, eps=GRPO_EPS,
                           singleton="zero").astype(values.dtype)
