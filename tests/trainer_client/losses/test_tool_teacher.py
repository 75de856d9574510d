"""The tool-layout OpenAI teacher (``TeacherConfig(kind="openai", layout="tools")``) without an
endpoint: the request a replayed step sends (the chat the ``openai-tools:`` eval policy starts a
turn with, the tools API, the full schemas in ``chat_template_kwargs``) and the answer read from
the role's tool call, through a :class:`TeacherPool` to a DPO pair. The end-to-end check against
``vllm serve`` is in tests/e2e/test_vllm_cpu.py (scripts/check_vllm_cpu.sh)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import load_problem_source
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateAction, DebateObservation
from trainer_client.evaluation.openai_tools import ToolConversations
from trainer_client.evaluation.policies import TurnRequest
from trainer_client.losses.replay_pairs import tool_call_message
from trainer_client.losses.teachers import OpenAITeacher, ReplayRequest, TeacherConfig, TeacherPool, extract_answer
from trainer_client.rollout.tool_calls import TOOLS_KWARG, tool_schemas

SOURCE = load_problem_source("gen:single_digit_sum")


def _observation(episode: DebateEpisode) -> DebateObservation:
    return DebateObservation.model_validate(json.loads(episode.last_observation)["observation"])


def _request(episode: DebateEpisode, student: str) -> ReplayRequest:
    observation = _observation(episode)
    assert observation.role is not None
    return ReplayRequest(episode_id="e", t=observation.t, role=observation.role, problem_id=episode.problem.problem_id,
                         messages=[m.model_dump() for m in observation.messages], student_response=student,
                         student_answer=extract_answer(observation.role, student))


def _teacher(name: str, replies: list[dict[str, Any]], sent: list[dict[str, Any]]) -> OpenAITeacher:
    """A tool-layout teacher whose endpoint answers with ``replies`` in turn (the assistant
    ``message`` of each), recording the bodies it was sent."""
    teacher = OpenAITeacher(TeacherConfig(name=name, kind="openai", layout="tools", base_url="http://teacher/v1",
                                          model="tiny", max_retries=0))

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        sent.append(json.loads(request.content))
        message = replies[min(len(sent), len(replies)) - 1]
        return httpx.Response(200, json={"choices": [{"message": message}],
                                         "usage": {"prompt_tokens": 30, "completion_tokens": 7}})

    teacher._http = httpx.Client(base_url="http://teacher/v1", transport=httpx.MockTransport(handle))
    return teacher


def _call(name: str, arguments: dict[str, str], content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_tools_layout_is_for_openai_and_hf_teachers() -> None:
    with pytest.raises(ValidationError, match="layout 'tools' is for kinds 'openai' and 'hf'"):
        TeacherConfig(name="t", kind="oracle", layout="tools")
    assert TeacherConfig(name="t", kind="hf", model="m", layout="tools").layout == "tools"
    assert TeacherConfig(name="t", kind="openai", base_url="u", model="m").layout == "chat"


def test_a_local_hf_teacher_answers_in_the_tool_layout(tiny_model_dir) -> None:
    """A local model trained in the tool layout (the tiny model) asked as a teacher: the solver's
    chat of the server's ``state(t)`` in the tool layout, its own generated call read back as the
    role's action (the text a pair's chosen side is built from)."""
    from trainer_client.losses.teachers import build_teacher

    problem = SOURCE.by_seed(3)
    episode = DebateEpisode("e", problem, max_rounds=1, max_action_chars=4096)
    messages = json.loads(episode.last_observation)["observation"]["messages"]
    teacher = build_teacher(TeacherConfig(name="local", kind="hf", model=tiny_model_dir, layout="tools", max_tokens=96))
    reply = teacher.answer(ReplayRequest(episode_id="e", t=0, role=Role.SOLVER, problem_id=problem.problem_id,
                                         messages=messages, student_response="", student_answer=None))
    from trainer_client.rollout.tool_calls import read_tool_call

    assert reply.generated is not None and reply.generated.startswith("<tool_call>")
    name, arguments = read_tool_call(reply.generated)
    assert name == "submit_solution" and arguments is not None  # a valid call of the solver's tool
    assert reply.text and reply.text == arguments["solution"].strip()[:4096] and reply.completion_tokens > 0


def test_tool_teacher_asks_in_the_eval_layout_and_reads_the_role_tool_call() -> None:
    problem = SOURCE.by_seed(3)
    episode = DebateEpisode("e", problem, max_rounds=1, max_action_chars=4096)
    request = _request(episode, r"So \boxed{-1}")
    sent: list[dict[str, Any]] = []
    solution = rf"{problem.problem} It is \boxed{{{problem.answer}}}"
    teachers = [_teacher(f"t{i}", [_call("submit_solution", {"solution": solution})], sent) for i in range(2)]
    pool = TeacherPool(teachers, equivalent=lambda a, b: a == b, budget_per_step=2, max_workers=2)
    try:
        pool.submit_step(5, [request])
        pool.wait(timeout_s=30)
        (pair,) = pool.collect()
        counters = pool.counters()
    finally:
        pool.close()
    # the request: the chat the openai-tools: eval policy starts this turn with, the tools API,
    # and the full schemas (``return`` included) for the served training template
    observation = _observation(episode)
    eval_messages = ToolConversations().messages(TurnRequest(Role.SOLVER, observation, "e"))
    assert len(sent) == 2 and sent[0] == sent[1]
    body = sent[0]
    assert body["messages"] == eval_messages
    assert body["tools"] == tool_schemas() and body["chat_template_kwargs"] == {TOOLS_KWARG: tool_schemas()}
    assert [t["function"]["name"] for t in body["tools"]] == ["submit_final_answer", "submit_solution", "submit_verdict"]
    assert "return" in body["tools"][0]["function"]
    assert (body["model"], body["tool_choice"], body["temperature"]) == ("tiny", "auto", 0.0)
    # the answer: the submit_solution call's solution, as the pair's chosen side
    assert (pair.chosen, pair.rejected, pair.teacher, pair.created_step) == (solution, r"So \boxed{-1}", "t0", 5)
    assert tool_call_message(Role.SOLVER, pair.chosen) == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "submit_solution", "arguments": {"solution": solution}}}]}
    assert counters["teachers/calls"] == 2 and counters["teachers/tokens"] == 74 and counters["pairs/emitted"] == 1


def test_tool_teacher_abstains_without_a_valid_call_of_the_role_tool() -> None:
    episode = DebateEpisode("e", SOURCE.by_seed(4), max_rounds=1, max_action_chars=4096)
    solver = _request(episode, r"\boxed{1}")
    sent: list[dict[str, Any]] = []
    replies = [{"role": "assistant", "content": r"plain text \boxed{4}"},  # no tool call
               _call("submit_verdict", {"verdict": "CORRECT", "critique": "ok"}),  # another role's tool
               _call("submit_solution", {"answer": "4"}),  # wrong arguments
               _call("submit_solution", {"solution": r"\boxed{4}"}, content="Thinking.")]
    teacher = _teacher("t", replies, sent)
    answers = [teacher.answer(solver) for _ in replies]
    assert [a.text for a in answers] == ["", "", "", r"\boxed{4}"]
    assert answers[0].generated == r"plain text \boxed{4}"
    assert answers[3].generated == ('Thinking.\n<tool_call>\n{"name": "submit_solution", "arguments": '
                                    '{"solution": "\\\\boxed{4}"}}\n</tool_call>')
    assert [extract_answer(Role.SOLVER, a.text) for a in answers] == [None, None, None, "4"]
    assert (answers[3].prompt_tokens, answers[3].completion_tokens) == (30, 7)
    # a verifier step: its instructions, and the verdict read from submit_verdict
    episode.step(DebateAction(role=Role.SOLVER, content=r"\boxed{1}"))
    verifier = _request(episode, "VERDICT: CORRECT")
    assert verifier.role is Role.VERIFIER
    verdict = _teacher("v", [_call("submit_verdict", {"verdict": "incorrect", "critique": "1 is wrong."})], sent)
    reply = verdict.answer(verifier)
    assert sent[-1]["messages"][1]["content"].startswith("[VERIFIER] ")
    assert reply.text == "1 is wrong.\n\nVERDICT: INCORRECT" and extract_answer(Role.VERIFIER, reply.text) == "INCORRECT"
