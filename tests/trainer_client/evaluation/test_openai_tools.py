"""The tool-call layout of ``openai-tools:`` policies (trainer_client.evaluation.openai_tools),
without an endpoint: the chat each turn sends, the action read from the reply's tool call, and
the conversation carried to the next turn. The end-to-end check against ``vllm serve`` is in
tests/e2e/test_vllm_cpu.py (scripts/check_vllm_cpu.sh)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import load_problem_source
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateAction, DebateObservation
from trainer_client.evaluation.openai_tools import ToolConversations, tool_schemas
from trainer_client.evaluation.policies import TurnRequest
from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT, render_instructions


def _observation(episode: DebateEpisode) -> DebateObservation:
    return DebateObservation.model_validate(json.loads(episode.last_observation)["observation"])


def _reply(name: str, arguments: dict, content: str = "") -> SimpleNamespace:
    call = SimpleNamespace(id="call_1", function=SimpleNamespace(name=name, arguments=json.dumps(arguments)))
    return SimpleNamespace(content=content, tool_calls=[call])


def test_turns_continue_the_tool_conversation() -> None:
    assert [t["function"]["name"] for t in tool_schemas()] == ["submit_final_answer", "submit_solution", "submit_verdict"]
    assert "return" in tool_schemas()[0]["function"]  # the full schema TRL renders (vLLM would drop it)
    episode = DebateEpisode("e", load_problem_source("gen:single_digit_sum").by_seed(0), max_rounds=1,
                            max_action_chars=4096)
    state = ToolConversations()
    first = TurnRequest(Role.SOLVER, _observation(episode), "e")
    messages = state.messages(first)
    assert messages == [{"role": "system", "content": DEBATE_SYSTEM_PROMPT},
                        {"role": "user", "content": render_instructions(first.observation)}]
    action, generated = state.action(first, messages, _reply("submit_solution", {"solution": "So \\boxed{7}"}))
    assert action == "So \\boxed{7}" and generated.startswith("<tool_call>\n{\"name\": \"submit_solution\"")
    episode.step(DebateAction(role=Role.SOLVER, content=action))
    second = TurnRequest(Role.VERIFIER, _observation(episode), "e")
    follow = state.messages(second)
    assert follow[:2] == messages and follow[2]["tool_calls"][0]["function"]["name"] == "submit_solution"
    assert follow[3] == {"role": "tool", "tool_call_id": "call_1", "name": "submit_solution",
                         "content": render_instructions(second.observation)}
    # a second draw on the same turn sends the first draw's chat; a reply without a call submits its text
    assert state.messages(TurnRequest(Role.SOLVER, first.observation, "e", draw=1)) == messages
    action, _ = state.action(second, follow, SimpleNamespace(content="VERDICT: CORRECT", tool_calls=None))
    assert action == "VERDICT: CORRECT" and "e" not in state.conversations  # the tool conversation ended
    state.episode_done("e")
    assert not state.turn_contexts
