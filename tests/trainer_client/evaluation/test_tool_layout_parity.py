"""``hf:`` and ``openai-tools:`` play a debate in the same layout: for the same generated turns,
the token ids each side feeds the model are equal turn for turn (``hf:``'s context against the
``openai-tools:`` chat rendered as ``vllm serve`` renders it with the served template of
``training_chat_template_file``), and so are the actions and forfeits they submit. No model and
no endpoint: the turns' texts are given, the replies are what vLLM's hermes parser returns for
them; the end-to-end check against ``vllm serve`` is in tests/e2e/test_vllm_cpu.py.

Issue 47: with the committed tiny model, a second round's solver called the verifier's tool;
``hf:`` submitted the call's markup as the solver's answer, ``openai-tools:`` the forfeit
placeholder, so every later turn differed (0 of 20 greedy debates alike)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import load_problem_source
from env_server.protocol.errors import InvalidActionError
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateAction, DebateObservation
from trainer_client.evaluation.hf_policy import TokenConversations
from trainer_client.evaluation.openai_tools import (
    ToolConversations,
    hermes_reply,
    tool_schemas,
    training_chat_template_file,
)
from trainer_client.evaluation.policies import TurnRequest
from trainer_client.rollout.tool_calls import TOOLS_KWARG, tool_callables
from trainer_client.rollout.tools import FORFEIT_ACTION

END = "<|im_end|>"


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _vllm_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call as vLLM's hermes parser returns it (arguments: a JSON string, ensure_ascii off)."""
    return {"id": "chatcmpl-tool-1", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


# A 2-round debate's turns as generated (the tiny model's own form: a call alone, or text first),
# with the chat-completions message vllm 0.31 (--tool-call-parser hermes) returns for each, and
# the action and forfeit both layouts must submit.
SOLUTION = {"solution": "3 + 4 = 8, so \\boxed{8}"}
REJECT = {"verdict": "INCORRECT", "critique": "3 + 4 is 7."}
TURNS: list[tuple[Role, str, dict[str, Any], str, str | None]] = [
    (Role.SOLVER, _call("submit_solution", SOLUTION),
     {"content": None, "tool_calls": [_vllm_call("submit_solution", SOLUTION)]},
     "3 + 4 = 8, so \\boxed{8}", None),
    (Role.VERIFIER, _call("submit_verdict", REJECT),
     {"content": None, "tool_calls": [_vllm_call("submit_verdict", REJECT)]},
     "3 + 4 is 7.\n\nVERDICT: INCORRECT", None),
    # the second round's solver calls the verifier's tool (what the committed tiny model does)
    (Role.SOLVER, _call("submit_verdict", {"verdict": "CORRECT", "critique": "Fine."}),
     {"content": None, "tool_calls": [_vllm_call("submit_verdict", {"verdict": "CORRECT", "critique": "Fine."})]},
     FORFEIT_ACTION, "invalid_tool_call"),
    # a call that is not JSON: no call, the whole text is the reply (and the tool conversation ends)
    (Role.VERIFIER, 'VERDICT: CORRECT\n<tool_call>\n{"name": "submit_verdict", "arguments": {"verdict": }\n</tool_call>',
     {"content": 'VERDICT: CORRECT\n<tool_call>\n{"name": "submit_verdict", "arguments": {"verdict": }\n</tool_call>',
      "tool_calls": []},
     'VERDICT: CORRECT\n<tool_call>\n{"name": "submit_verdict", "arguments": {"verdict": }\n</tool_call>', None),
    # text, then a call of another role's tool: the text is the action
    (Role.JUDGE, "The answer is 7.\n" + _call("submit_solution", {"solution": "\\boxed{7}"}),
     {"content": "The answer is 7.\n", "tool_calls": [_vllm_call("submit_solution", {"solution": "\\boxed{7}"})]},
     "The answer is 7.", None),
]


def _observation(episode: DebateEpisode) -> DebateObservation:
    return DebateObservation.model_validate(json.loads(episode.last_observation)["observation"])


def _step(episode: DebateEpisode, role: Role, action: str) -> None:
    """Submit as the eval runner does: an action the server refuses becomes the placeholder."""
    try:
        episode.step(DebateAction(role=role, content=action))
    except InvalidActionError:
        episode.step(DebateAction(role=role, content=FORFEIT_ACTION))


def _served_ids(tokenizer: Any, template: str, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt token ids ``vllm serve --chat-template`` builds for an ``openai-tools:`` request:
    the assistant calls' arguments parsed to objects (vllm ``_postprocess_messages``), the
    request's ``tools`` as vLLM keeps them (name, description, parameters) and the full schemas in
    ``chat_template_kwargs``, rendered to text, then tokenised without special tokens added."""
    chat = json.loads(json.dumps(messages))
    for message in chat:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    kept = [{"type": "function", "function": {k: t["function"][k] for k in ("name", "description", "parameters")}}
            for t in tool_schemas()]
    text = tokenizer.apply_chat_template(chat, tools=kept, chat_template=template, add_generation_prompt=True,
                                         tokenize=False, **{TOOLS_KWARG: tool_schemas()})
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_hf_and_openai_tools_feed_the_same_tokens_and_submit_the_same_actions(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoTokenizer

    from trainer_client.rollout.chat_template import training_chat_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    template = training_chat_template_file(tiny_model_dir, tmp_path / "chat_template.jinja").read_text()
    hf = TokenConversations(tokenizer, tool_callables(), training_chat_template(tokenizer))
    tools = ToolConversations()
    problem = load_problem_source("gen:single_digit_sum").by_seed(0)
    episodes = {side: DebateEpisode("e", problem, max_rounds=2, max_action_chars=4096) for side in ("hf", "tools")}
    continued = []
    for t, (role, generated, message, action, forfeit) in enumerate(TURNS):
        observations = {side: _observation(episode) for side, episode in episodes.items()}
        assert observations["hf"] == observations["tools"] and observations["hf"].role is role and observations["hf"].t == t
        hf_request = TurnRequest(role, observations["hf"], "e")
        tools_request = TurnRequest(role, observations["tools"], "e")
        continued.append("e" in hf.conversations)
        assert continued[-1] == ("e" in tools.conversations), t
        context = hf.context(hf_request)
        messages = tools.messages(tools_request)
        assert _served_ids(tokenizer, template, messages) == context, f"turn {t}: the prompts differ"
        turn = hf.record(hf_request, context, generated + END)
        tools_action, _ = tools.action(tools_request, messages, message)
        assert (turn.action, turn.forfeit) == (action, forfeit), t
        assert tools_action == action, t
        assert turn.after == context + tokenizer(generated, add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id]
        _step(episodes["hf"], role, turn.action)  # each side plays on with its own action
        _step(episodes["tools"], role, tools_action)
    assert all(episode.done for episode in episodes.values())
    # the conversation went on after each call (valid or not) and restarted after the turn without one
    assert continued == [False, True, True, True, False]


@pytest.mark.parametrize(("generated", "expected"), [
    ("Done.", {"content": "Done.", "tool_calls": []}),
    (_call("submit_solution", {"solution": "é \\boxed{1}"}),
     {"content": None, "tool_calls": [{"name": "submit_solution", "arguments": '{"solution": "é \\\\boxed{1}"}'}]}),
    ("  \n" + _call("submit_verdict", {"verdict": "CORRECT"}),
     {"content": None, "tool_calls": [{"name": "submit_verdict", "arguments": '{"verdict": "CORRECT"}'}]}),
    ("I think 7.\n\n" + _call("submit_verdict", {"verdict": "CORRECT"}),
     {"content": "I think 7.\n\n", "tool_calls": [{"name": "submit_verdict", "arguments": '{"verdict": "CORRECT"}'}]}),
    # a last call cut off before its closing tag still parses; any block that does not parse
    # (not JSON, no name or arguments, a name that is not a string) leaves no call at all
    ('<tool_call>\n{"name": "submit_solution", "arguments": {"solution": "x"}}',
     {"content": None, "tool_calls": [{"name": "submit_solution", "arguments": '{"solution": "x"}'}]}),
    (_call("submit_solution", {"solution": "x"}) + '\n<tool_call>\n{"name": "bad"}\n</tool_call>',
     {"content": _call("submit_solution", {"solution": "x"}) + '\n<tool_call>\n{"name": "bad"}\n</tool_call>',
      "tool_calls": []}),
    ('<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
     {"content": '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>', "tool_calls": []}),
    ("<tool_call>\n[1, 2]\n</tool_call>", {"content": "<tool_call>\n[1, 2]\n</tool_call>", "tool_calls": []}),
    ('<tool_call>\n{"name": "submit_solution", "arguments": "x"}\n</tool_call>',
     {"content": None, "tool_calls": [{"name": "submit_solution", "arguments": '"x"'}]}),
])
def test_hermes_reply_is_what_vllms_hermes_parser_returns(generated: str, expected: dict[str, Any]) -> None:
    """Each case as vllm 0.31's ``Hermes2ProToolParser.extract_tool_calls`` (with the chat
    server's blank-content rule) returned it for the same text."""
    reply = hermes_reply(generated)
    assert {"content": reply["content"],
            "tool_calls": [c["function"] for c in reply["tool_calls"]]} == expected
