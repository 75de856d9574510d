"""The TRL environment adapter against a live server, and which tokens belong to which turn (completion segments)."""

from __future__ import annotations

import pytest

from env_server.debate.problems import ProblemGenerator
from env_server.protocol.markers import ErrorKind, Role
from trainer_client.rollout.environment import environment_factory, shared_client
from trainer_client.rollout.segments import SegmentOwner, completion_segments, mask_runs, owned_segments, segment_turns
from trainer_client.rollout.tools import DEBATE_OVER
from trainer_client.rollout.trace import TurnLog

GENERATOR = ProblemGenerator()


def test_tools_play_a_debate_and_get_reward_reads_the_graded_record(server_url) -> None:
    env_class = environment_factory(server_url, max_rounds=2)
    env = env_class()
    problem = GENERATOR.by_seed(5)
    text = env.reset(prompt=[{"role": "user", "content": ""}], seed=5)
    assert text.startswith("[SOLVER]") and problem.problem in text and "submit_solution" in text
    with pytest.raises(ValueError, match="submit_solution"):
        env.submit_verdict("CORRECT", "looks fine")  # wrong tool for the turn: an error for the model
    text = env.submit_solution(rf"\boxed{{{problem.answer}}}")
    assert text.startswith("[VERIFIER]") and "submit_verdict" in text
    text = env.submit_verdict("correct", "I checked it.")
    assert text.startswith("[JUDGE]")
    assert env.submit_final_answer(problem.answer) == DEBATE_OVER
    with pytest.raises(ValueError):
        env.submit_solution("again")
    assert env.get_reward() == 1.0
    assert [(t.t, t.role, t.source) for t in env.trace.turns] == [
        (0, Role.SOLVER, "tool"), (1, Role.VERIFIER, "tool"), (2, Role.JUDGE, "tool")]
    # every instance shares the process's one connection
    assert env._client is env_class()._client is shared_client(server_url)


def test_a_rollout_without_tool_calls_still_completes_a_graded_episode(server_url) -> None:
    env = environment_factory(server_url, max_rounds=1)()
    problem = GENERATOR.by_seed(8)
    env.reset(problem_id=problem.problem_id)
    env.trace.finish(f"I think the answer is \\boxed{{{problem.answer}}}")
    record = env.trace.wait_record()
    assert [t.source for t in env.trace.turns] == ["fallback", "forfeit", "forfeit"]
    assert record.turns[0].correct and record.turns[1].error_kind is ErrorKind.MISSING_VERDICT
    assert record.turns[2].error_kind is ErrorKind.MISSING_FINAL_ANSWER
    assert record.episode_reward == 1.0  # no judge answer: the solver's answer stands
    # get_reward on a rollout that did nothing forfeits every turn
    env.reset(seed=9)
    assert env.get_reward() == 0.0 and all(t.source == "forfeit" for t in env.trace.turns)


def test_mask_runs() -> None:
    assert mask_runs([1, 1, 0, 0, 1, 0, 1, 1, 0, 0]) == [(0, 2), (4, 5), (6, 8)]
    assert mask_runs([0, 0]) == [] and mask_runs([1]) == [(0, 1)]


def _tool_call(name: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {}}}]}


def test_segments_align_with_turns_through_tool_results() -> None:
    turns = [TurnLog(0, Role.SOLVER, "tool", "to verifier"), TurnLog(1, Role.VERIFIER, "tool", "to judge"),
             TurnLog(2, Role.JUDGE, "tool", DEBATE_OVER)]
    messages = [
        _tool_call("submit_solution"), {"role": "tool", "content": "to verifier"},
        _tool_call("submit_solution"), {"role": "tool", "content": {"error": "It is the verifier's turn"}},  # rejected
        _tool_call("submit_verdict"), {"role": "tool", "content": "to judge"},
        _tool_call("submit_final_answer"), {"role": "tool", "content": DEBATE_OVER},
        {"role": "assistant", "content": "bye"},  # after the end: no owner
    ]
    assert segment_turns(messages, turns) == [
        SegmentOwner(0, Role.SOLVER, True), SegmentOwner(1, Role.VERIFIER, False), SegmentOwner(1, Role.VERIFIER, True),
        SegmentOwner(2, Role.JUDGE, True), None]
    tokens = [1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0]
    segments = completion_segments(messages, turns, tokens)
    owned = owned_segments(segments)
    assert [(s.turn, s.role, s.start, s.end) for s in owned] == [
        (0, Role.SOLVER, 0, 2), (1, Role.VERIFIER, 4, 5), (1, Role.VERIFIER, 6, 8), (2, Role.JUDGE, 9, 10)]
    assert completion_segments(messages, turns, [1, 0, 1]) is None  # token runs and messages disagree


def test_fallback_message_owns_the_last_segment() -> None:
    turns = [TurnLog(0, Role.SOLVER, "fallback"), TurnLog(1, Role.VERIFIER, "forfeit"), TurnLog(2, Role.JUDGE, "forfeit")]
    assert segment_turns([{"role": "assistant", "content": r"\boxed{3}"}], turns) == [SegmentOwner(0, Role.SOLVER, True)]


def test_the_trace_handle_is_not_a_tool_and_replays_what_the_role_saw(server_url) -> None:
    """TRL exposes every public function of an environment as a tool: the trainer's handle is a
    property, so the model's tools stay the three role tools; ``replay(t)`` is ``state(t)``."""
    import inspect

    env_cls = environment_factory(server_url, max_rounds=1)
    tools = [name for name, _ in inspect.getmembers(env_cls, predicate=inspect.isfunction)
             if not name.startswith("_") and name not in ("reset", "get_reward")]
    assert sorted(tools) == ["submit_final_answer", "submit_solution", "submit_verdict"]
    env = env_cls()
    env.reset(seed=3)
    shown = env.trace.observation
    env.submit_solution(solution="I think \\\\boxed{1}")
    replayed = env.trace.state_at(0)
    assert (replayed.messages, replayed.t, replayed.role) == (shown.messages, 0, Role.SOLVER)
    assert len(env.trace.turns) == 1 and not env.trace.done
    env.trace.finish(None)
    assert env.trace.done and env.trace.wait_record().episode_id == shown.episode_id
