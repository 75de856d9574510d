"""The tool-call layout of an ``openai-tools:BASE_URL#MODEL`` policy: a model trained by
``mathdebate train`` answers through the OpenAI tools API, in the conversation TRL's tool loop
showed it in training.

Each turn's request holds what :mod:`~trainer_client.evaluation.hf_policy` feeds a local model,
as chat messages for the endpoint's chat template: the system message
:data:`~trainer_client.rollout.tools.DEBATE_SYSTEM_PROMPT`, a user message with
:func:`~trainer_client.rollout.tools.render_instructions` of the observation, and the environment's tools
(``tools=``, the JSON schemas transformers renders from the same callables). The model's reply
comes back as ``tool_calls`` (vLLM: ``--enable-auto-tool-choice --tool-call-parser hermes``, the
``<tool_call>`` JSON the tiny model and Qwen emit); a valid call of the acting role's tool is the
action (:func:`~trainer_client.rollout.tool_calls.role_tool_action`, as for ``hf:``), else the reply's text is
submitted, or the forfeit placeholder when it is blank. The next turn of the same episode
continues the conversation: the assistant's tool call, then a tool message holding the next
role's instructions (TRL's tool-result layout); when another policy played the turn in between,
the conversation restarts from the current observation. Draws after the first (best-of-N) reuse
the first draw's context. Verdict probabilities are not read in this layout (the verdict is a
tool argument, not a ``VERDICT:`` line): best-of-N's verifier selection gets ``None`` there.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.rollout.tool_calls import TOOLS_KWARG, tool_schemas

__all__ = ["TOOLS_KWARG", "ToolConversations", "tool_schemas", "training_chat_template_file"]

def training_chat_template_file(model_dir: str | Path, out: str | Path) -> Path:
    """Write the chat template to serve ``model_dir`` with to ``out`` (``vllm serve
    --chat-template``): the one TRL trains it with, rendering the tools of
    ``chat_template_kwargs[TOOLS_KWARG]`` when a request sends them (see the module docstring)."""
    from transformers import AutoTokenizer

    from trainer_client.experiments.tiny_model import training_chat_template

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
        ``tool_calls``), and the episode's conversation moved past this turn."""
        from trainer_client.rollout.tool_calls import generated_text, reply_tool_call, role_tool_action
        from trainer_client.rollout.tools import FORFEIT_ACTION

        text, name, arguments = reply_tool_call(message)
        generated = generated_text(text, name, arguments)
        action = role_tool_action(generated, request.role) if name is not None else None
        if action is None:
            action = text[:4096] or FORFEIT_ACTION
        if request.draw == 0:
            self.calls += 1
            # what the model said, as the assistant message the next turn continues from; a turn
            # without a (parsable) call ends the tool conversation as in training, so the next
            # turn restarts from its observation
            if name is not None and isinstance(arguments, dict):
                call_id = getattr((getattr(message, "tool_calls", None) or [None])[0], "id", None)
                call = {"id": call_id or f"call_{self.calls}", "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
                self.conversations[request.episode_key] = _Conversation(
                    [*messages, {"role": "assistant", "content": text, "tool_calls": [call]}],
                    request.observation.t + 1, request.role)
            else:
                self.conversations.pop(request.episode_key, None)
            self.turn_contexts[request.episode_key, request.observation.t] = messages
        return action, generated

    def episode_done(self, episode_key: str) -> None:
        self.conversations.pop(episode_key, None)
        for key in [k for k in self.turn_contexts if k[0] == episode_key]:
            del self.turn_contexts[key]
