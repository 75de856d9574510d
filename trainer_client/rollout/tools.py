"""The debate as tool calls: the training prompt's system message, each role's tool and its
arguments, the role's instructions rendered from an observation, and the placeholder text of a
forfeited turn. The layout every trained model answers in (TRL's tool loop)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation

__all__ = ["DEBATE_OVER", "DEBATE_SYSTEM_PROMPT", "FORFEIT_ACTION", "TOOL_ARGUMENTS", "TOOL_FOR_ROLE", "TOOL_PARAMETERS",
           "action_content", "render_instructions", "role_instructions"]

#: System message for the training prompt: the model plays every role through the tools.
DEBATE_SYSTEM_PROMPT = (
    "You take part in a math debate and play each role in turn: the solver, the verifier and the "
    "judge. Act only by calling the tool for your current role; each tool's answer tells you what "
    "to do next."
)

TOOL_FOR_ROLE: dict[Role, str] = {
    Role.SOLVER: "submit_solution",
    Role.VERIFIER: "submit_verdict",
    Role.JUDGE: "submit_final_answer",
}

_TOOL_HINT: dict[Role, str] = {
    Role.SOLVER: "Call submit_solution with your complete solution, ending with the final answer in \\boxed{...}.",
    Role.VERIFIER: "Call submit_verdict with your verdict (CORRECT or INCORRECT) and your critique.",
    Role.JUDGE: "Call submit_final_answer with the final answer.",
}

#: Placeholder actions used to forfeit the turns a rollout left unplayed.
FORFEIT_ACTION = "(no response)"
_FORFEIT = FORFEIT_ACTION

DEBATE_OVER = "The debate is over. Thank you."


def render_instructions(observation: DebateObservation) -> str:
    """The acting role's task as text: its system instructions, the last message addressed to
    it, and the tool to call. Used for the reset text and for every tool's return value."""
    if observation.role is None:
        return DEBATE_OVER
    return role_instructions(observation.role, [{"role": m.role, "content": m.content} for m in observation.messages])


def role_instructions(role: Role, messages: Sequence[Mapping[str, Any]]) -> str:
    """:func:`render_instructions` from the acting ``role`` and its chat as plain message dicts
    (``role``, ``content``): what a replayed step's chat renders to."""
    system = next((m["content"] for m in messages if m["role"] == "system"), "")
    last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    return f"[{role.value.upper()}] {system}\n\n{last_user}\n\n{_TOOL_HINT[role]}"


#: The tool of each role, with its argument names (the adapter's public methods).
TOOL_ARGUMENTS: dict[str, tuple[Role, tuple[str, ...]]] = {
    "submit_solution": (Role.SOLVER, ("solution",)),
    "submit_verdict": (Role.VERIFIER, ("verdict", "critique")),
    "submit_final_answer": (Role.JUDGE, ("answer",)),
}


#: Each tool's description and JSON-schema parameters, in TRL's order, exactly as
#: ``transformers.utils.get_json_schema`` reads them from the adapter's methods (what the training
#: prompt shows; ``tool_calls.tool_schemas`` computes them, a test keeps the two equal): for
#: clients without transformers, such as the harness's MCP tools.
TOOL_PARAMETERS: dict[str, tuple[str, dict[str, Any]]] = {
    "submit_final_answer": ("Close the debate as the judge by giving the final answer.", {
        "type": "object",
        "properties": {"answer": {"type": "string",
                                  "description": "The final answer in LaTeX, for example \\frac{1}{2}."}},
        "required": ["answer"]}),
    "submit_solution": ("Submit your solution as the solver.", {
        "type": "object",
        "properties": {"solution": {"type": "string", "description": "Your complete solution, ending with the "
                                                                   "final answer in \\boxed{...}."}},
        "required": ["solution"]}),
    "submit_verdict": ("Submit your review of the solution as the verifier.", {
        "type": "object",
        "properties": {"verdict": {"type": "string", "description": "CORRECT if the solution's final answer is "
                                                                 "right, otherwise INCORRECT."},
                       "critique": {"type": "string", "description": "Your step-by-step check of the solution."}},
        "required": ["verdict", "critique"]}),
}


def action_content(tool: str, arguments: dict[str, str]) -> str:
    """The action text the adapter submits for a tool call: the solver's solution as is; the
    verifier's ``critique`` then ``VERDICT: <verdict>``; the judge's answer wrapped in
    ``\\boxed{}`` unless it has one.

    Raises:
        KeyError: an unknown tool or a missing argument.
        AttributeError: an argument that is not a string.
    """
    if tool == "submit_solution":
        return arguments["solution"]
    if tool == "submit_verdict":
        return f"{arguments['critique']}\n\nVERDICT: {arguments['verdict'].strip().upper()}"
    if tool == "submit_final_answer":
        answer = arguments["answer"]
        return answer if "\\boxed" in answer else f"The final answer is $\\boxed{{{answer.strip()}}}$."
    raise KeyError(tool)
