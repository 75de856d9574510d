"""A debate turn as an OpenAI tools-API exchange, in the layout a model trained by ``mathdebate
train`` answers in: the request (the chat of a turn started from its observation, the tools'
full JSON schemas) and the action read back from the role's tool call. Shared by the
``openai-tools:`` eval policy (:mod:`trainer_client.evaluation.openai_tools`, which adds the
conversation carried across turns and the served chat template) and the ``layout: tools``
OpenAI teacher of trace-replay DPO (:mod:`trainer_client.losses.teachers`).

A turn started from its observation is what TRL's tool loop shows the model at a rollout's
start: the system message :data:`~trainer_client.rollout.tools.DEBATE_SYSTEM_PROMPT` and a user
message with :func:`~trainer_client.rollout.tools.render_instructions` of the observation. The
reply's first tool call is the action when it is a valid call of the acting role's tool
(:func:`role_tool_action`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from env_server.protocol.markers import Role

__all__ = ["END_OF_TURN", "TOOLS_KWARG", "generated_text", "read_tool_call", "reply_tool_call", "role_tool_action",
           "tool_callables", "tool_schemas", "turn_messages"]

#: The ``chat_template_kwargs`` key carrying the full tool schemas: vLLM's OpenAI server keeps only
#: ``name``, ``description`` and ``parameters`` of a request's ``tools`` (vllm 0.31), TRL renders
#: the full schemas (``return`` included); the served template of
#: :func:`~trainer_client.evaluation.openai_tools.training_chat_template_file` renders these.
TOOLS_KWARG = "mathdebate_tools"

_TOOL_CALL = re.compile(r"<tool_call>\s*(.+?)\s*</tool_call>", re.DOTALL)
#: The end-of-turn token of the tool-call layout (Qwen's chat format, TRL's tool loop).
END_OF_TURN = "<|im_end|>"


def tool_callables() -> list[Any]:
    """The adapter's tools as TRL passes them to ``apply_chat_template``: bound methods, in TRL's
    order (trl 1.16 ``GRPOTrainer.__init__`` lists an environment's public methods with
    ``inspect.getmembers(type(instance), inspect.isfunction)`` minus ``reset`` and ``get_reward``,
    i.e. sorted by name:
    ``submit_final_answer``, ``submit_solution``, ``submit_verdict``), without connecting to a
    server. The order matters: it is the order of the schemas in the prompt, and a model warmed
    up on another order sees an unfamiliar prompt in training."""
    import inspect

    from trainer_client.rollout.environment import DebateEnvironment

    instance = object.__new__(DebateEnvironment)
    return [getattr(instance, name) for name, _ in inspect.getmembers(DebateEnvironment, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")]


def tool_schemas() -> list[dict[str, Any]]:
    """The debate tools as OpenAI ``tools`` entries, in TRL's order (:func:`tool_callables`)."""
    from transformers.utils.chat_template_utils import get_json_schema

    return [get_json_schema(tool) for tool in tool_callables()]


def turn_messages(role: Role, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The tool-layout chat of a turn started from its observation: the debate system prompt and
    the role's instructions (:func:`~trainer_client.rollout.tools.role_instructions` of the
    server's role chat ``messages``, as ``render_instructions`` renders an observation)."""
    from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT, role_instructions

    return [{"role": "system", "content": DEBATE_SYSTEM_PROMPT},
            {"role": "user", "content": role_instructions(role, messages)}]


def read_tool_call(text: str) -> tuple[str | None, dict[str, Any] | None]:
    """``(tool name, arguments)`` of a generated turn's first ``<tool_call>{json}</tool_call>``
    (text up to ``<|im_end|>``): ``(None, None)`` if no call parses, ``(name, None)`` if its
    arguments are not an object."""
    match = _TOOL_CALL.search(text.split(END_OF_TURN, 1)[0])
    if match is None:
        return None, None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None, None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, None
    arguments = call.get("arguments")
    return call["name"], arguments if isinstance(arguments, dict) else None


def role_tool_action(text: str, role: Any) -> str | None:
    """The action a generated turn amounts to when it is a valid call of ``role``'s tool (its
    first tool call names the role's tool with exactly that tool's string arguments, and the
    action text is not blank): :func:`~trainer_client.rollout.tools.action_content` of the call, cut to
    4,096 characters; else ``None`` (the caller falls back to the turn's text, as the training
    adapter does)."""
    from trainer_client.rollout.tools import TOOL_ARGUMENTS, TOOL_FOR_ROLE, action_content

    name, arguments = read_tool_call(text)
    tool_role, names = TOOL_ARGUMENTS.get(name or "", (None, ()))
    if tool_role is None or tool_role is not role or arguments is None or set(arguments) != set(names) or not all(
            isinstance(arguments[a], str) for a in names):
        return None
    content = action_content(TOOL_FOR_ROLE[tool_role], arguments)
    return content[:4096] if content.strip() else None


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def reply_tool_call(message: Any) -> tuple[str, str | None, Any]:
    """What a chat-completions reply ``message`` (the ``openai`` client's object or the JSON
    dict) said: ``(text, name, arguments)``: its stripped ``content``, and the name and decoded
    arguments of its first tool call (``(text, None, None)`` without one; arguments that are not
    JSON stay the raw string)."""
    text = (_field(message, "content") or "").strip()
    calls = list(_field(message, "tool_calls") or [])
    if not calls:
        return text, None, None
    function = _field(calls[0], "function")
    name, raw = _field(function, "name"), _field(function, "arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        arguments = raw
    return text, name, arguments


def generated_text(text: str, name: str | None, arguments: Any) -> str:
    """The reply as the model generated it in the hermes layout: its text, then the tool call as
    ``<tool_call>{json}</tool_call>`` (the reply's text alone when it has no call)."""
    if name is None:
        return text
    return (text + "\n" if text else "") + "<tool_call>\n" + json.dumps(
        {"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
