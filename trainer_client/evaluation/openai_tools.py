"""The tool-call layout of an ``openai-tools:BASE_URL#MODEL`` policy: a model trained by
``mathdebate train`` answers through the OpenAI tools API, in the conversation TRL's tool loop
showed it in training.

Each turn's request holds what :mod:`~trainer_client.evaluation.hf_policy` feeds a local model,
as chat messages for the endpoint's chat template: the system message
:data:`~trainer_client.rollout.tools.DEBATE_SYSTEM_PROMPT`, a user message with
:func:`~trainer_client.rollout.tools.render_instructions` of the observation, and the environment's tools
(``tools=``, the JSON schemas transformers renders from the same callables). The model's reply
comes back as ``tool_calls`` (vLLM: ``--enable-auto-tool-choice --tool-call-parser hermes``, the
``<tool_call>`` JSON the tiny model and Qwen emit). :func:`read_tool_reply` turns a reply into the
action, the one rule ``hf:`` applies too (to :func:`hermes_reply` of its generated text): a valid
call of the acting role's tool is the action
(:func:`~trainer_client.rollout.tool_calls.role_tool_action`); a call the role's tool does not take
submits the reply's text outside the call, or the forfeit placeholder (``invalid_tool_call``)
when there is none, never the call's markup (in training the adapter forfeits a turn that ends
in a tool call: ``DebateGRPOTrainer.on_completions``); a reply without a parsable call submits
its text, or the forfeit placeholder when it is blank. After a reply with a call (object
arguments), the next turn of the same episode continues the conversation: the assistant's tool
call, then a tool message holding the next role's instructions (TRL's tool-result layout). A
reply without one ends the tool conversation (in training, a turn without a call ends the
rollout), and so does another policy playing the turn in between: the next turn restarts from its
observation. Draws after the first (best-of-N) reuse the first draw's context. Verdict
probabilities are not read in this layout (the verdict is a tool argument, not a ``VERDICT:``
line): best-of-N's verifier selection gets ``None`` there.

For the served model to see the training layout token for token, serve it with the chat template
:func:`training_chat_template_file` writes: TRL's training template (a prefix-preserving variant
of the tokenizer's where the tokenizer's own is not one) behind one line that renders the tools
from the request's ``chat_template_kwargs`` (:data:`TOOLS_KWARG`) when present. The reason: TRL
renders each tool's full JSON schema, ``return`` included (transformers' ``get_json_schema`` of the
environment's methods), but vLLM's OpenAI server keeps only ``name``, ``description``,
``parameters`` (``FunctionDefinition._serialize``, vllm 0.31), so a prompt rendered from the
request's ``tools`` alone differs from the training prompt. The request still carries ``tools``
(vLLM's tool-call parser runs only then) and sends the full schemas in ``chat_template_kwargs``
too (a vLLM extension; other endpoints may reject it: use ``openai:`` there). The served
template also renders an earlier assistant message without reasoning as the model wrote it,
without the empty think block the training template adds when it re-renders history: TRL
continues a rollout from the model's own tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.rollout.tool_calls import TOOLS_KWARG, tool_schemas

__all__ = ["TOOLS_KWARG", "ToolConversations", "ToolReply", "hermes_reply", "read_tool_reply", "tool_schemas",
           "training_chat_template_file"]

def training_chat_template_file(model_dir: str | Path, out: str | Path) -> Path:
    """Write the chat template to serve ``model_dir`` with to ``out`` (``vllm serve
    --chat-template``): the one TRL trains it with, rendering the tools of
    ``chat_template_kwargs[TOOLS_KWARG]`` when a request sends them (see the module docstring)."""
    from transformers import AutoTokenizer

    from trainer_client.rollout.chat_template import training_chat_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    template = training_chat_template(tokenizer) or tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError(f"{model_dir} has no single chat template")
    # TRL continues a rollout from the model's own tokens; the training template re-renders an
    # earlier assistant message with an empty think block the model never generated (trl 1.16
    # qwen3 training template). Under the tool layout, a message without reasoning is rendered as
    # the model wrote it.
    if _THINK_BLOCK in template:
        template = template.replace(_THINK_BLOCK, f"{{%- if {TOOLS_KWARG} is defined and not reasoning_content %}}"
                                                  f"{{{{- content.lstrip('\\n') }}}}{{%- else %}}{_THINK_BLOCK}{{%- endif %}}")
    path = Path(out)
    path.write_text(f"{{%- if {TOOLS_KWARG} is defined %}}{{%- set tools = {TOOLS_KWARG} %}}{{%- endif %}}\n" + template)
    return path


_THINK_BLOCK = "{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"


_TOOL_CALL_REGEX = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def hermes_reply(generated: str) -> dict[str, Any]:
    """The chat-completions ``message`` (``content``, ``tool_calls``) that vLLM's OpenAI server
    with ``--tool-call-parser hermes`` returns for a generated turn: what ``openai-tools:`` reads
    back from ``vllm serve``, and what ``hf:`` reads its own turns as, so that both policies submit
    the same action and carry the same conversation for the same generated text.

    Mirrors ``Hermes2ProToolParser.extract_tool_calls`` (vllm 0.31,
    ``vllm/tool_parsers/hermes_tool_parser.py``): without ``<tool_call>`` the text is the content
    and there is no call; otherwise every ``<tool_call>...</tool_call>`` block (or a last block
    cut off before its closing tag) must be a JSON object with ``name`` (a string) and
    ``arguments``, else there is no call and the whole text is the content; with calls, the
    content is the text before the first ``<tool_call>`` (``None`` when blank) and each call's
    ``arguments`` is ``json.dumps(arguments, ensure_ascii=False)``. Our own copy because vLLM is
    an optional extra (the ``vllm`` environment), not importable where ``hf:`` runs.

    Args:
        generated: the turn's text up to its end-of-turn token (special tokens kept).

    Returns:
        ``{"content": str | None, "tool_calls": [{"id", "type", "function": {"name", "arguments"}}]}``.
    """
    if "<tool_call>" not in generated:
        return {"content": generated, "tool_calls": []}
    try:
        calls = [json.loads(closed or open_) for closed, open_ in _TOOL_CALL_REGEX.findall(generated)]
        tool_calls = [{"id": f"call_{i}", "type": "function",
                       "function": {"name": _str(call["name"]),
                                    "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
                      for i, call in enumerate(calls)]
    except (ValueError, KeyError, TypeError):  # vLLM catches any error: no calls, the raw text as content
        return {"content": generated, "tool_calls": []}
    content = generated[:generated.find("<tool_call>")]
    return {"content": content if content.strip() else None, "tool_calls": tool_calls}


def _str(value: Any) -> str:
    if not isinstance(value, str):  # vLLM's FunctionCall(name=...) rejects it (pydantic), so no calls
        raise TypeError("a tool call's name must be a string")
    return value


@dataclass(frozen=True)
class ToolReply:
    """A turn's reply read as the tool layout's action (:func:`read_tool_reply`).

    Attributes:
        action: what to submit: the role tool's action, else the reply's text (cut to 4,096
            characters), else :data:`~trainer_client.rollout.tools.FORFEIT_ACTION`.
        generated: the reply in the hermes layout (text, then the call as ``<tool_call>`` JSON).
        forfeit: ``"invalid_tool_call"`` when the reply holds a call the role's tool does not
            take and no text (the action is then the placeholder); ``None`` otherwise.
        text: the reply's stripped text outside the call.
        call: the first call as an OpenAI ``function`` (``name``, ``arguments`` as a JSON string)
            when its arguments are an object: the next turn continues the conversation after it;
            ``None``: the tool conversation ends with this turn.
    """

    action: str
    generated: str
    forfeit: str | None
    text: str
    call: dict[str, str] | None


def read_tool_reply(role: Role, message: Any) -> ToolReply:
    """The action of a tool-layout reply ``message`` (the ``openai`` client's object, a JSON dict,
    or :func:`hermes_reply` of a generated turn) for the acting ``role``: the rule of the module
    docstring, shared by ``openai-tools:`` and ``hf:``."""
    from trainer_client.rollout.tool_calls import generated_text, reply_tool_call, role_tool_action
    from trainer_client.rollout.tools import FORFEIT_ACTION

    text, name, arguments = reply_tool_call(message)
    generated = generated_text(text, name, arguments)
    action = role_tool_action(generated, role) if name is not None else None
    forfeit = None
    if action is None:
        action = text[:4096] or FORFEIT_ACTION
        forfeit = "invalid_tool_call" if name is not None and not text else None
    call = ({"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
            if name is not None and isinstance(arguments, dict) else None)
    return ToolReply(action, generated, forfeit, text, call)


@dataclass
class _Conversation:
    messages: list[dict[str, Any]]
    next_t: int
    role: Role


@dataclass
class ToolConversations:
    """Per-episode chat state of the tool layout (see the module docstring)."""

    conversations: dict[str, _Conversation] = field(default_factory=dict)
    turn_contexts: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    calls: int = 0

    def messages(self, request: Any) -> list[dict[str, Any]]:
        """The chat to send for ``request`` (a :class:`~trainer_client.evaluation.policies.TurnRequest`)."""
        from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT, TOOL_FOR_ROLE, render_instructions

        observation = request.observation
        key = (request.episode_key, observation.t)
        if request.draw > 0 and key in self.turn_contexts:
            return self.turn_contexts[key]
        conversation = self.conversations.get(request.episode_key)
        if conversation is not None and conversation.next_t == observation.t:
            last_call = conversation.messages[-1]["tool_calls"][0]
            return [*conversation.messages, {"role": "tool", "tool_call_id": last_call["id"],
                                             "name": TOOL_FOR_ROLE[conversation.role],
                                             "content": render_instructions(observation)}]
        return [{"role": "system", "content": DEBATE_SYSTEM_PROMPT},
                {"role": "user", "content": render_instructions(observation)}]

    def action(self, request: Any, messages: list[dict[str, Any]], message: Any) -> tuple[str, str]:
        """``(action, generated)`` from the endpoint's reply ``message`` (its ``content`` and
        ``tool_calls``; :func:`read_tool_reply`), and the episode's conversation moved past this turn."""
        reply = read_tool_reply(request.role, message)
        if request.draw == 0:
            self.calls += 1
            # what the model said, as the assistant message the next turn continues from; a turn
            # without a (parsable) call ends the tool conversation as in training, so the next
            # turn restarts from its observation
            if reply.call is not None:
                call_id = getattr((getattr(message, "tool_calls", None) or [None])[0], "id", None)
                call = {"id": call_id or f"call_{self.calls}", "type": "function", "function": reply.call}
                self.conversations[request.episode_key] = _Conversation(
                    [*messages, {"role": "assistant", "content": reply.text, "tool_calls": [call]}],
                    request.observation.t + 1, request.role)
            else:
                self.conversations.pop(request.episode_key, None)
            self.turn_contexts[request.episode_key, request.observation.t] = messages
        return reply.action, reply.generated

    def episode_done(self, episode_key: str) -> None:
        self.conversations.pop(episode_key, None)
        for key in [k for k in self.turn_contexts if k[0] == episode_key]:
            del self.turn_contexts[key]
