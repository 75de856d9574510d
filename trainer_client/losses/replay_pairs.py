"""Trace-replay DPO pairs on the policy's own tokens and format (pure helpers).

The policy generated each debate turn inside TRL's tool-calling conversation: the system and
user prompt, its earlier assistant tool-call messages and the tool results, then one assistant
message calling the role's tool. A pair for turn ``t`` therefore uses

- context: the rollout's prompt + completion token ids before the assistant message that
  produced turn ``t`` (:func:`rollout_pair_ids`; the exact ids the policy conditioned on, never
  a re-rendering, which could tokenize differently from what was sampled);
- rejected: that message's tokens, exactly as generated (:func:`rollout_pair_ids`);
- chosen: the teacher's response as the same role's tool call (:func:`tool_call_message`:
  ``submit_solution(solution)``, ``submit_verdict(verdict, critique)``,
  ``submit_final_answer(answer)``), rendered by the policy's chat template the way TRL 1.16
  renders an assistant tool-call message (``GRPOTrainer._get_tool_suffix_ids``: a
  ``{"role": "assistant", "content": "", "tool_calls": [...]}`` message after a dummy user
  message) and tokenized as the delta after the generation prompt, cut after the end-of-turn
  token as a generated message ends (:func:`tool_call_response_ids`). TRL builds every
  rollout from such per-message deltas and requires a prefix-preserving template, so the
  delta is what would follow the rollout's context had the policy written that message.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any, cast

from env_server.debate.answers import VERDICT_PATTERN, final_answer, parse_verdict
from env_server.protocol.markers import Role
from trainer_client.rollout.tools import TOOL_FOR_ROLE

__all__ = [
    "as_policy_writes",
    "cap_response",
    "disagreement_weights",
    "rollout_pair_ids",
    "tool_call_message",
    "tool_call_response_ids",
    "verdict_and_critique",
]

#: the verdict marker as the server's parser reads it (``env_server.debate.answers.parse_verdict``)
_VERDICT = re.compile(rf"(?:{VERDICT_PATTERN.pattern})[*_`\"']*", re.IGNORECASE)  # with its closing markup
#: the empty reasoning block of Qwen3-style chat templates (see :func:`tool_call_response_ids`)
_EMPTY_REASONING = "<think>\n\n</think>\n\n"
#: the base conversation TRL renders single messages after (``_get_tool_suffix_ids``)
_DUMMY_BASE = ({"role": "user", "content": "dummy"},)


def verdict_and_critique(text: str) -> tuple[str, str] | None:
    """A verifier response split into ``submit_verdict``'s arguments: the verdict (the last
    ``VERDICT:`` marker, read as the server reads it) and the critique (the rest of the text:
    every verdict marker removed, lines left empty by that dropped). ``None`` without a verdict."""
    verdict = parse_verdict(text)
    if verdict is None:
        return None
    lines = []
    for line in text.splitlines():
        if _VERDICT.search(line):
            line = _VERDICT.sub("", line).rstrip()
            if not any(ch.isalnum() for ch in line):
                continue
        lines.append(line)
    return verdict, "\n".join(lines).strip()


def tool_call_message(role: Role, text: str) -> dict[str, Any] | None:
    """A teacher's response as the assistant message the policy would write for ``role``: a call
    of the role's tool with the response as its arguments.

    Solver: ``submit_solution(solution=text)``. Verifier: ``submit_verdict(verdict, critique)``
    (:func:`verdict_and_critique`). Judge: ``submit_final_answer(answer=<last boxed content>)``.

    Returns:
        The message (TRL's shape: ``content`` empty, one ``function`` tool call whose
        ``arguments`` is a dict), or ``None`` when the text has no verdict (verifier) or no
        ``\\boxed{}`` answer (judge).
    """
    arguments: dict[str, str]
    if role is Role.SOLVER:
        arguments = {"solution": text}
    elif role is Role.VERIFIER:
        parsed = verdict_and_critique(text)
        if parsed is None:
            return None
        arguments = {"verdict": parsed[0], "critique": parsed[1]}
    else:
        answer = final_answer(text)
        if answer is None:
            return None
        arguments = {"answer": answer}
    call = {"type": "function", "function": {"name": TOOL_FOR_ROLE[role], "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def tool_call_response_ids(processor: Any, message: dict[str, Any], *, chat_template: str | None,
                           eos_token_id: int | None, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of ``message`` as the policy would generate them after a generation prompt.

    Args:
        processor: the policy's tokenizer (``apply_chat_template``).
        message: an assistant message (e.g. from :func:`tool_call_message`).
        chat_template: the training template (the trainer's ``chat_template``), or ``None`` for
            the tokenizer's own.
        eos_token_id: the end-of-turn token: the delta is cut after its last occurrence, as
            TRL cuts a rendered assistant message (what follows it belongs to the next message).
        template_kwargs: the trainer's ``chat_template_kwargs``.

    Raises:
        ValueError: the template does not render the generation prompt as a prefix of the
            message (not prefix-preserving; TRL's tool loop needs one that is), or renders
            nothing for it.
    """
    kwargs = {"chat_template": chat_template, "tokenize": True, "return_dict": False, **(template_kwargs or {})}
    base = [dict(m) for m in _DUMMY_BASE]
    prefix = cast("list[int]", list(processor.apply_chat_template(base, add_generation_prompt=True, **kwargs)))
    full = cast("list[int]", list(processor.apply_chat_template([*base, message], add_generation_prompt=False,
                                                                **kwargs)))
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template does not render an assistant message after its generation prompt "
                         "(not prefix-preserving): replay pairs cannot be put in the policy's format")
    delta = full[len(prefix):]
    if eos_token_id is not None and eos_token_id in delta:
        delta = delta[: len(delta) - delta[::-1].index(eos_token_id)]

    if not delta:
        raise ValueError("the chat template renders nothing for the assistant message")
    return delta


def as_policy_writes(processor: Any, chosen_ids: Sequence[int], rejected_ids: Sequence[int]) -> list[int]:
    """``chosen_ids`` in the format of the policy's own message ``rejected_ids``: an empty reasoning
    block that a Qwen3-style template renders before an assistant message
    (``<think>\n\n</think>\n\n``, not in the generation prompt) is dropped when the policy's own
    message does not start with ``<think>``. The block is the template's rendering of "no
    reasoning"; a policy that does not reason never writes it, and left in, the chosen side began
    with tokens such a policy never generates (about 240 nats on the tiny model): DPO then taught
    the block, not the answer."""
    chosen = list(chosen_ids)
    block = list(processor(_EMPTY_REASONING, add_special_tokens=False)["input_ids"])
    think = block[:1]
    if (len(chosen) > len(block) and chosen[: len(block)] == block
            and list(rejected_ids[:1]) != think):
        return chosen[len(block):]
    return chosen


def rollout_pair_ids(prompt_ids: Sequence[int], prompt_mask: Sequence[int], completion_ids: Sequence[int],
                     start: int, end: int) -> tuple[list[int], list[int]]:
    """The context and the policy's own tokens of one assistant message of a rollout.

    Args:
        prompt_ids, prompt_mask: the rollout's prompt row as TRL pads it (left padding, mask 0).
        completion_ids: the rollout's completion row (the model's and the tools' tokens).
        start, end: the message's token range in the completion (a :class:`~trainer_client.rollout.segments.Segment`).

    Returns:
        ``(context, response)``: the prompt's real tokens + ``completion_ids[:start]``, and
        ``completion_ids[start:end]``.
    """
    prompt = [int(tok) for tok, keep in zip(prompt_ids, prompt_mask, strict=True) if keep]
    return prompt + [int(tok) for tok in completion_ids[:start]], [int(tok) for tok in completion_ids[start:end]]


def cap_response(ids: Sequence[int], max_length: int) -> list[int]:
    """``ids`` cut to ``max_length`` tokens, keeping the last one (the end-of-turn token)."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    return [*ids[: max(0, max_length - 1)], ids[-1]] if max_length > 0 else []


def disagreement_weights(chosen_ids: Sequence[int], rejected_ids: Sequence[int],
                         shared_weight: float = 0.0) -> tuple[list[float], list[float]]:
    """Per-token weights of a pair's two sides for a preference margin taken where they disagree.

    Let ``p`` be the length of the two sides' common prefix (the first token where they differ
    is token ``p``). Tokens before ``p`` weigh 0 (the shared prefix: excluded by construction).
    After it, the two tails ``chosen[p:]`` and ``rejected[p:]`` are matched token by token with
    ``difflib.SequenceMatcher`` (the longest matching blocks, no junk heuristic): a token in a
    matching block is text both sides share (the same column-addition steps after a different
    digit, the closing tool-call tokens) and weighs ``shared_weight``; every other token weighs 1.
    The margin ``Σ w_c·(log π − log π_ref)(chosen) − Σ w_r·(log π − log π_ref)(rejected)`` then
    pushes the rejected side down only where it says something the chosen side does not, and
    the chosen side up only where it differs.

    Args:
        chosen_ids, rejected_ids: the two sides' token ids (as scored: capped alike).
        shared_weight: weight of the shared tokens after the first difference, in ``[0, 1]``
            (0 excludes them, 1 weighs them as DPO does).

    Returns:
        ``(chosen_weights, rejected_weights)``, one float per token of each side.

    Raises:
        ValueError: ``shared_weight`` outside ``[0, 1]``.
    """
    if not 0.0 <= shared_weight <= 1.0:
        raise ValueError(f"shared_weight must be in [0, 1], got {shared_weight}")
    chosen, rejected = list(chosen_ids), list(rejected_ids)
    p = 0
    while p < min(len(chosen), len(rejected)) and chosen[p] == rejected[p]:
        p += 1
    weights_c = [0.0] * p + [1.0] * (len(chosen) - p)
    weights_r = [0.0] * p + [1.0] * (len(rejected) - p)
    matcher = difflib.SequenceMatcher(None, chosen[p:], rejected[p:], autojunk=False)
    for block in matcher.get_matching_blocks():
        for j in range(block.size):
            weights_c[p + block.a + j] = shared_weight
            weights_r[p + block.b + j] = shared_weight
    return weights_c, weights_r
