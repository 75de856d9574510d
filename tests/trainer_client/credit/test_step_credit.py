"""GiGPO on debate turns: episode level per role, anchor states from the turn log, judge excluded."""

from __future__ import annotations

from typing import Any

import numpy as np
from records import make_record, per_role_normalize

from env_server.client import StepResult
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation, EpisodeRewards
from env_server.protocol.models import Message as ObsMessage
from trainer_client.credit.gigpo import gigpo_turn_values
from trainer_client.credit.reward_functions import EvaluateResult, RolloutMessage, StepOutput
from trainer_client.credit.role_samples import build_role_samples, turn_values
from trainer_client.credit.step_credit import (
    AFTER_THE_END,
    REJECTED_CALL,
    UNANSWERED_CALL,
    rollout_steps,
    step_rewards,
)
from trainer_client.rollout.environment import DebateEnvironment
from trainer_client.rollout.trace import TurnLog


def test_debate_gigpo_by_hand() -> None:
    # one group of two single-round debates: solver right / wrong, verifier right in both
    records = [make_record([True], [True], True, "a"), make_record([False], [False], False, "b")]
    samples = build_role_samples(records, [0, 0])
    shaped = samples.rewards.copy()  # identity shaping: G = [1, 0] for both roles
    rewards = [[r.reward for r in rec.turns] for rec in records]  # [1, 1, 0] and [0, 1, 0]
    # t=0 both saw the same solver prompt; t=1 the verifier saw different solutions; t=2 judge
    observations = [["prompt", "check A", "judge A"], ["prompt", "check B", "judge B"]]
    values, metrics = gigpo_turn_values(samples, shaped, rewards, observations, [0, 0], omega=1.0, gamma=1.0)
    # Eq. 3 per role: solver and verifier A^E = [+0.5, -0.5]
    # Eq. 5: returns a: [2, 1, 0], b: [1, 1, 0]
    # Eq. 7: t=0 cluster {2, 1} -> [+0.5, -0.5]; t=1 singletons -> 0; the judge is in no cluster
    np.testing.assert_allclose(values[0], [1.0, 0.5, 0.0])
    np.testing.assert_allclose(values[1], [-1.0, -0.5, 0.0])
    assert metrics["gigpo/anchor_fraction"] == 0.5  # 2 of the 4 non-judge steps share a cluster
    # with omega 0 it is the episode level alone: plain per-role centring, as GRPO without std
    centred = turn_values(samples, per_role_normalize(shaped, samples.roles, [0] * len(samples.index), scale=False))
    values0, _ = gigpo_turn_values(samples, shaped, rewards, observations, [0, 0], omega=0.0, gamma=1.0)
    for got, want in zip(values0, centred, strict=True):
        np.testing.assert_allclose(got, want)


def test_steps_and_user_step_rewards() -> None:
    record = make_record([False, True], [False, True], True)  # solver, verifier, solver, verifier, judge
    log = [TurnLog(0, Role.SOLVER, "tool", "x0", "p0"), TurnLog(1, Role.VERIFIER, "tool", "x1", "p1"),
           TurnLog(2, Role.SOLVER, "fallback", None, "p2"), TurnLog(3, Role.VERIFIER, "forfeit", None, "p3"),
           TurnLog(4, Role.JUDGE, "forfeit", None, "p4")]
    messages = [_call("submit_solution"), _answer("x0"), _call("submit_verdict"), _answer("x1"),
                {"role": "assistant", "content": "fallback text"}]
    rollout = rollout_steps(record, log, messages)
    steps = rollout.steps
    assert [s.step_info.get("assistant_turn_index") for s in steps] == [0, 1, 2, None, None]
    assert [s.step_info["source"] for s in steps] == ["tool", "tool", "fallback", "forfeit", "forfeit"]
    assert [s.observation_data for s in steps] == ["p0", "p1", "p2", "p3", "p4"] and steps[-1].is_done
    # no user result: the server's per-turn rewards, kept on the steps with their returns
    assert step_rewards(record, rollout, None, 0.0, gamma=1.0)[0] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert [s.base_reward for s in steps] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert [s.return_to_go for s in steps] == [3.0, 3.0, 2.0, 1.0, 0.0]
    # user step outputs: aligned, default elsewhere, unmatched reported
    result = EvaluateResult(score=1, step_outputs=[StepOutput(step_index=2, base_reward=5.0),
                                                   StepOutput(step_index=3, base_reward=9.0)])
    rewards, problems = step_rewards(record, rollout_steps(record, log, messages), result, -1.0, gamma=1.0)
    assert rewards == [-1.0, -1.0, 5.0, -1.0, -1.0] and len(problems) == 1


# --------------------------------------------------------------------------- assistant_turn_index


def _call(*names: str) -> dict[str, Any]:
    """An assistant message calling ``names`` (TRL's parsed form)."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": {}}} for n in names]}


def _answer(content: str) -> dict[str, Any]:
    return {"role": "tool", "name": "t", "content": content}


class _Session:
    """The server side of one single-round debate (solver, verifier, judge), as a stub session."""

    def __init__(self) -> None:
        self.t = 0
        self.transcript: list[str] = []

    def _result(self) -> StepResult:
        role = [Role.SOLVER, Role.VERIFIER, Role.JUDGE, None][min(self.t, 3)]
        system = f"You are the {role.value if role else 'nobody'}."
        last = "Problem: 1+1. " + " | ".join(self.transcript)
        obs = DebateObservation(episode_id="ep", problem_id="p", problem="1+1", role=role, t=self.t, round=0,
                                max_rounds=1, messages=[ObsMessage(role="system", content=system),
                                                        ObsMessage(role="user", content=last)], transcript=[])
        return StepResult(observation=obs, reward=None, done=role is None, metadata={})

    def reset(self, **kwargs: Any) -> StepResult:
        return self._result()

    def step(self, role: Role, content: str) -> StepResult:
        self.transcript.append(f"{role.value}: {content}")
        self.t += 1
        return self._result()


_ARGUMENTS = {"submit_solution": {"solution": r"\boxed{2}"}, "submit_verdict": {"verdict": "CORRECT", "critique": "ok"},
              "submit_final_answer": {"answer": "2"}}


class _Rollout:
    """A :class:`DebateEnvironment` on a stub session, driven the way TRL 1.16's tool loop drives
    it: the model's tool calls run in order, an exception becomes ``str({"error": ...})`` in the
    tool message, and the trainer finishes the debate with the last message when it has no call."""

    def __init__(self) -> None:
        env = object.__new__(DebateEnvironment)
        env._session, env._observation, env._turns, env._record = _Session(), None, [], None  # type: ignore[assignment]  # a stub session stands in for the server
        self.env = env
        self.prompt = [{"role": "system", "content": "debate"}, {"role": "user", "content": env.reset()}]
        self.completion: list[dict[str, Any]] = []

    def calls(self, *names: str, answered: bool = True) -> _Rollout:
        """One assistant message calling ``names``; ``answered=False``: TRL dropped the tool
        messages (they would have passed ``max_completion_length``), or never ran the calls (``run=False``)."""
        self.completion.append(_call(*names))
        for name in names:
            try:
                content = str(getattr(self.env, name)(**_ARGUMENTS[name]))
            except Exception as exc:
                content = str({"error": str(exc)})
            if answered:
                self.completion.append({"role": "tool", "name": name, "content": content})
        return self

    def unrun_call(self, name: str) -> _Rollout:
        """A last tool call TRL never ran (``max_tool_calling_iterations`` reached)."""
        self.completion.append(_call(name))
        return self

    def says(self, text: str) -> _Rollout:
        self.completion.append({"role": "assistant", "content": text})
        return self

    def finish(self) -> tuple[EpisodeRewards, list[TurnLog]]:
        last = self.completion[-1] if self.completion else {}
        text = last.get("content") if last.get("role") == "assistant" and not last.get("tool_calls") else None
        if not self.env._done:
            self.env._finish(text)
        record = make_record([True], [True], True)  # t = 0 solver, 1 verifier, 2 judge
        assert [turn.t for turn in record.turns] == [entry.t for entry in self.env._turns]
        return record, list(self.env._turns)


_REWARD_BY_TOOL = {"submit_solution": 1.0, "submit_verdict": 2.0, "submit_final_answer": 3.0}


def by_tool(messages: list[RolloutMessage], ground_truth: Any = None, **kwargs: Any) -> EvaluateResult:
    """A user reward function: one step output per assistant message (counted from 0), rewarding
    it by the tool it called (1 solution, 2 verdict, 3 final answer, 4 plain text)."""
    steps = []
    for index, message in enumerate(m for m in messages if m.role == "assistant"):
        name = message.tool_calls[0]["function"]["name"] if message.tool_calls else None
        steps.append(StepOutput(step_index=index, base_reward=_REWARD_BY_TOOL.get(name, 4.0) if name else 4.0))
    return EvaluateResult(score=1.0, step_outputs=steps)


_OWN: Any = object()


def _credit(rollout: _Rollout, completion: list[dict[str, Any]] | None = _OWN, default: float = -1.0
            ) -> tuple[list[Any], list[float], list[str], Any]:
    """What ``_gigpo_inputs`` does for one rollout, with the user's function given the rollout's
    messages as ``_user_rewards`` gives them (prompt + completion)."""
    record, log = rollout.finish()
    messages = [RolloutMessage.model_validate(m) for m in rollout.prompt + rollout.completion]
    result = by_tool(messages)
    steps = rollout_steps(record, log, rollout.completion if completion is _OWN else completion)
    rewards, problems = step_rewards(record, steps, result, default, gamma=0.5)
    return [s.step_info.get("assistant_turn_index") for s in steps.steps], rewards, problems, steps


def test_a_rejected_call_takes_an_index_and_each_reward_lands_on_the_turn_its_message_wrote() -> None:
    rollout = (_Rollout().calls("submit_solution")
               .calls("submit_solution")  # the verifier's turn: rejected, an error in the tool message
               .calls("submit_verdict").calls("submit_final_answer"))
    assert rollout.completion[3]["content"].startswith("{'error': \"It is the verifier's turn")
    _, log = rollout.finish()
    assert [(e.t, e.source) for e in log] == [(0, "tool"), (1, "tool"), (2, "tool")]
    indices, rewards, problems, rollout_data = _credit(rollout)
    # the verifier's turn gets the verdict's reward, not the rejected solver call's (t-based: [1, 1, 2])
    assert rewards == [1.0, 2.0, 3.0]
    # assistant messages 0 (solution), 1 (rejected), 2 (verdict), 3 (final answer)
    assert indices == [0, 2, 3]
    assert problems == ["step output 1 names an assistant message that produced no debate turn (a rejected tool call)"]
    assert rollout_data.unplaced == {1: REJECTED_CALL} and rollout_data.unmatched is None
    # the steps keep r_t and R_t = r_t + 0.5 R_{t+1}
    assert [s.return_to_go for s in rollout_data.steps] == [1.0 + 0.5 * (2.0 + 0.5 * 3.0), 2.0 + 0.5 * 3.0, 3.0]


def test_fallback_after_a_rejected_call_and_forfeits() -> None:
    rollout = _Rollout().calls("submit_verdict").says(r"The answer is \boxed{2}")  # rejected, then plain text
    _, log = rollout.finish()
    assert [(e.t, e.source) for e in log] == [(0, "fallback"), (1, "forfeit"), (2, "forfeit")]
    indices, rewards, problems, steps = _credit(rollout)
    assert indices == [1, None, None]  # the fallback is assistant message 1; forfeits have none
    assert rewards == [4.0, -1.0, -1.0]  # the forfeited turns get the default
    assert steps.unplaced == {0: REJECTED_CALL} and len(problems) == 1


def test_an_empty_rollout_forfeits_every_turn_without_indices_or_problems() -> None:
    indices, rewards, problems, steps = _credit(_Rollout())
    assert indices == [None, None, None] and rewards == [-1.0] * 3 and problems == []
    assert steps.unmatched is None and [s.step_info["source"] for s in steps.steps] == ["forfeit"] * 3


def test_messages_after_the_end_and_a_call_never_run() -> None:
    after = _Rollout().calls("submit_solution").calls("submit_verdict").calls("submit_final_answer").says("bye")
    indices, rewards, problems, steps = _credit(after)
    assert indices == [0, 1, 2] and rewards == [1.0, 2.0, 3.0]
    assert steps.unplaced == {3: AFTER_THE_END}
    assert problems == ["step output 3 names an assistant message that was written after the debate ended"]
    # the last call was never run (TRL's iteration limit): the verifier's turn is forfeited
    unrun = _Rollout().calls("submit_solution").unrun_call("submit_verdict")
    indices, rewards, problems, steps = _credit(unrun)
    assert indices == [0, None, None] and rewards == [1.0, -1.0, -1.0]
    assert steps.unplaced == {1: UNANSWERED_CALL} and len(problems) == 1


def test_a_call_whose_answer_trl_dropped_still_names_its_turn() -> None:
    # the verdict ran (the turn was played) but its tool message would overflow max_completion_length
    rollout = _Rollout().calls("submit_solution").calls("submit_verdict", answered=False)
    _, log = rollout.finish()
    assert [(e.t, e.source) for e in log] == [(0, "tool"), (1, "tool"), (2, "forfeit")]
    indices, rewards, problems, steps = _credit(rollout)
    assert indices == [0, 1, None] and rewards == [1.0, 2.0, -1.0] and problems == [] and steps.unplaced == {}


def test_a_message_with_two_accepted_calls_names_its_first_turn() -> None:
    rollout = _Rollout().calls("submit_solution", "submit_verdict").calls("submit_final_answer")
    indices, rewards, problems, steps = _credit(rollout)
    assert indices == [0, None, 1]  # the message's tokens belong to the solver's turn
    assert rewards == [1.0, -1.0, 3.0] and problems == [] and steps.unmatched is None


def test_unmatched_messages_give_no_index_at_all_never_the_turn() -> None:
    rollout = _Rollout().calls("submit_solution").calls("submit_solution").calls("submit_verdict")
    # missing messages
    indices, rewards, problems, steps = _credit(rollout, completion=None)
    assert indices == [None, None, None] and rewards == [-1.0] * 3
    assert steps.unmatched == "the rollout's completion messages are missing"
    assert len(problems) == 3 and all("ignored: the rollout's completion messages are missing" in p for p in problems)
    # another rollout's messages: the verdict's tool answer is not there
    other = _Rollout().calls("submit_solution").calls("submit_verdict").completion
    other[-1]["content"] = "something else"
    indices, rewards, problems, steps = _credit(rollout, completion=other)
    assert indices == [None, None, None] and rewards == [-1.0] * 3
    assert steps.unmatched is not None and "no assistant message produced t=1 (verifier, tool)" in steps.unmatched
    assert len(problems) == 3
    # a turn log without the record's turns
    record, log = rollout.finish()
    lacking = rollout_steps(record, log[:1], rollout.completion)
    assert lacking.unmatched == "the turn log lacks turns [1, 2]"
    assert all("assistant_turn_index" not in s.step_info for s in lacking.steps)
