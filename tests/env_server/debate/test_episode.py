"""The debate state machine and the rewards record, without a server."""

from __future__ import annotations

import orjson
import pytest
from debate_steps import act, payload

from env_server.debate.episode import DebateEpisode
from env_server.debate.problems.base import Problem
from env_server.debate.rewards import episode_rewards_data
from env_server.protocol.errors import EpisodeDoneError, InvalidActionError, OutOfRangeError
from env_server.protocol.grades import Grade
from env_server.protocol.markers import HINT_TEMPLATES, ErrorKind, Role, hint_key
from env_server.protocol.models import EpisodeRewards

PROBLEM = Problem("p/1", "What is $6 \\times 7$?", "42", "6 times 7 is $\\boxed{42}$.")


def test_turn_order_ends_early_when_the_verifier_accepts() -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=3, max_action_chars=1000)
    assert ep.role is Role.SOLVER
    act(ep, "solver", r"\boxed{42}")
    assert ep.role is Role.VERIFIER
    act(ep, "verifier", "VERDICT: CORRECT")
    assert ep.role is Role.JUDGE and ep.accepted
    act(ep, "judge", r"\boxed{42}")
    assert ep.done and ep.step_count == 3


def test_rejections_run_up_to_max_rounds_then_the_judge() -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=2, max_action_chars=1000)
    roles = []
    for role, text in [("solver", r"\boxed{41}"), ("verifier", "VERDICT: INCORRECT"),
                       ("solver", r"\boxed{42}"), ("verifier", "VERDICT: INCORRECT")]:
        roles.append(ep.role)
        act(ep, role, text)
    assert roles == [Role.SOLVER, Role.VERIFIER, Role.SOLVER, Role.VERIFIER]
    assert ep.role is Role.JUDGE and ep.round == 1


def test_observation_shape_messages_and_transcript() -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=2, max_action_chars=1000)
    first = payload(ep.last_observation)
    assert first["observation"]["role"] == "solver" and first["observation"]["t"] == 0
    assert [m["role"] for m in first["observation"]["messages"]] == ["system", "user"]
    assert first["metadata"] == {"episode_id": "e", "turn": None, "role": None, "error_kind": None,
                                 "hint_template_key": None, "circular_critique": False, "grading": "none"}
    assert first["observation"]["mode"] == "debate"
    act(ep, "solver", r"I get \boxed{41}")
    act(ep, "verifier", "Step 2 is wrong. VERDICT: INCORRECT")
    obs = payload(ep.last_observation)["observation"]
    assert obs["role"] == "solver" and obs["round"] == 1
    assert [m["role"] for m in obs["messages"]] == ["system", "user", "assistant", "user"]
    assert "Step 2 is wrong" in obs["messages"][-1]["content"]
    assert [(t["t"], t["role"]) for t in obs["transcript"]] == [(0, "solver"), (1, "verifier")]


def test_markers_never_reach_the_text_shown_to_the_policy() -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=2, max_action_chars=1000)
    act(ep, "solver", "no box at all")
    data = payload(ep.last_observation)
    assert data["metadata"]["error_kind"] == "missing_final_answer"
    assert data["observation"]["metadata"] == data["metadata"]  # inside and at top level
    shown = orjson.dumps([data["observation"][k] for k in ("problem", "messages", "transcript")]).decode()
    assert "missing_final_answer" not in shown and "hint" not in shown


@pytest.mark.parametrize(
    ("role", "content", "kind"),
    [("verifier", "VERDICT: CORRECT", ErrorKind.ROLE_MISMATCH), ("solver", "  \n", ErrorKind.EMPTY_RESPONSE),
     ("solver", "x" * 1001, ErrorKind.TOO_LONG)],
)
def test_rejected_actions_are_typed_and_change_nothing(role: str, content: str, kind: ErrorKind) -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=2, max_action_chars=1000)
    before = ep.last_observation
    with pytest.raises(InvalidActionError) as info:
        act(ep, role, content)
    assert info.value.kind is kind
    assert info.value.extra["hint_template_key"] == f"solver/{kind.value}"
    assert ep.step_count == 0 and ep.last_observation is before


def test_step_after_done_and_replay_range() -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=1, max_action_chars=1000)
    sent = [ep.last_observation]
    for role, text in [("solver", r"\boxed{42}"), ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{42}")]:
        act(ep, role, text)
        sent.append(ep.last_observation)
    with pytest.raises(EpisodeDoneError):
        act(ep, "judge", r"\boxed{42}")
    assert [ep.observation_at(t) for t in range(3)] == sent[:3]
    for bad in (-1, 3, 99):
        with pytest.raises(OutOfRangeError):
            ep.observation_at(bad)


def test_repeated_rejected_answer_is_provisional() -> None:
    ep = DebateEpisode("e", PROBLEM, max_rounds=3, max_action_chars=1000)
    act(ep, "solver", r"\boxed{41}")
    act(ep, "verifier", "VERDICT: INCORRECT")
    turn = act(ep, "solver", r"still \boxed{ 41 }")
    assert turn.provisional_kind is ErrorKind.REPEATED_REJECTED_ANSWER
    assert payload(ep.last_observation)["metadata"]["hint_template_key"] == "solver/repeated_rejected_answer"


def _play(turns, grades_by_answer) -> EpisodeRewards:
    ep = DebateEpisode("e", PROBLEM, max_rounds=3, max_action_chars=1000)
    for role, text in turns:
        act(ep, role, text)
    grades = {t.t: grades_by_answer[t.answer] for t in ep.turns if t.needs_grade}
    record = EpisodeRewards.model_validate(episode_rewards_data(ep, grades, graded_at=1.0, session_id="s"))
    EpisodeRewards.model_validate_json(record.model_dump_json())
    return record


RIGHT, WRONG = Grade(True), Grade(False)
MISSING = Grade(False, ErrorKind.MISSING_FINAL_ANSWER, "rule")


def test_rewards_per_turn_and_counterfactual_facts() -> None:
    record = _play(
        [("solver", r"\boxed{41}"), ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{41}")],
        {"41": WRONG},
    )
    assert [(r.role, r.reward, r.error_kind) for r in record.turns] == [
        (Role.SOLVER, 0.0, ErrorKind.WRONG_ANSWER), (Role.VERIFIER, 0.0, ErrorKind.FALSE_ACCEPT),
        (Role.JUDGE, 0.0, ErrorKind.WRONG_ANSWER)]
    assert record.episode_reward == 0.0
    assert record.turns[1].hint_template_key == "verifier/false_accept"

    record = _play(
        [("solver", r"\boxed{41}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{42}"),
         ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{42}")],
        {"41": WRONG, "42": RIGHT},
    )
    assert [r.reward for r in record.turns] == [0.0, 1.0, 1.0, 1.0, 0.0]  # judge turns always 0
    facts = record.facts
    assert record.episode_reward == 1.0 and facts.final_answer_correct
    assert not facts.first_answer_correct and facts.last_solver_answer_correct and facts.judge_correct
    assert facts.verifier_accepted and facts.rounds == 2
    assert facts.local_rewards == {Role.SOLVER: 0.5, Role.VERIFIER: 1.0, Role.JUDGE: 1.0}
    assert facts.rewards_without_role == {Role.SOLVER: 0.0, Role.VERIFIER: 0.0, Role.JUDGE: 1.0}


def test_false_reject_repeated_answer_and_judge_fallback() -> None:
    record = _play(
        [("solver", r"\boxed{42}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{42}"),
         ("verifier", "no verdict here"), ("solver", r"\boxed{41}"), ("verifier", "VERDICT: INCORRECT"),
         ("judge", "I cannot decide.")],
        {"42": RIGHT, "41": WRONG, None: MISSING},
    )
    kinds = [r.error_kind for r in record.turns]
    # a correct answer repeated after a false rejection is not an error
    assert kinds == [None, ErrorKind.FALSE_REJECT, None, ErrorKind.MISSING_VERDICT, ErrorKind.WRONG_ANSWER,
                     None, ErrorKind.MISSING_FINAL_ANSWER]
    # the judge boxed nothing: the final answer is the solver's last one (41, wrong)
    assert record.facts.judge_correct is None and record.episode_reward == 0.0
    assert record.facts.first_answer_correct


def test_repeated_wrong_answer_keeps_its_marker() -> None:
    record = _play(
        [("solver", r"\boxed{41}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{41}"),
         ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{40}"), ("verifier", "VERDICT: INCORRECT"),
         ("judge", r"\boxed{40}")],
        {"41": WRONG, "40": WRONG},
    )
    assert record.turns[2].error_kind is ErrorKind.REPEATED_REJECTED_ANSWER


def test_grading_timeout_infects_the_reviewing_verifier() -> None:
    timeout = Grade(False, ErrorKind.GRADING_TIMEOUT)
    record = _play([("solver", r"\boxed{9^{9^{9^9}}}"), ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{42}")],
                   {"9^{9^{9^9}}": timeout, "42": RIGHT})
    assert [(r.reward, r.error_kind) for r in record.turns[:2]] == [
        (0.0, ErrorKind.GRADING_TIMEOUT), (0.0, ErrorKind.GRADING_TIMEOUT)]


def test_every_hint_key_is_a_role_and_a_kind() -> None:
    for key in HINT_TEMPLATES:
        role, kind = key.split("/")
        assert hint_key(Role(role), ErrorKind(kind)) == key
    assert hint_key(Role.VERIFIER, ErrorKind.WRONG_ANSWER) is None
