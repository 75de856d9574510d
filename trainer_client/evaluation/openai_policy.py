"""A role played by an OpenAI-compatible chat-completions endpoint (``openai:BASE_URL#MODEL``).

The request is the role's chat exactly as the env server built it (``observation.messages``:
the role's system prompt, the problem, the debate so far) and the reply's text is the action.
Calls go through the official ``openai`` client (its own retries with exponential backoff on
connection errors, 408/409/429 and 5xx, and its timeout), at most ``max_concurrency`` in
flight per policy. A call that still fails (an error status, a timeout, a dropped connection, a
200 that is not a chat completion) returns ``content=None`` with the typed failure and the
server's own message (:mod:`trainer_client.request_failures`): the runner marks the episode
failed, leaves it out of every accuracy and counts it; the run goes on. A reply whose message
has no text (and, in the tool layout, no call) is the model's own blank answer, not a failure:
``content=""``, which the runner forfeits and scores.

The key is read from the environment variable named by ``--api-key-env`` (never from the
command line); without one the client sends the placeholder ``EMPTY`` that local servers such
as ``vllm serve`` accept.

Verdict probabilities: for a verifier turn of best-of-N the request asks for
``logprobs`` (``top_logprobs=5``); when the endpoint returns them, the verdict token is the
first token after the last ``VERDICT:`` marker of the reply, and ``P(CORRECT)`` is the share
of the alternatives at that position that spell ``CORRECT`` against those that spell
``INCORRECT`` (:func:`accept_prob_from_logprobs`).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import zlib
from collections.abc import Sequence
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.evaluation.policies import Policy, PolicyOptions, TurnReply, TurnRequest
from trainer_client.request_failures import failure_from_exception, validated_choice

__all__ = ["OpenAIPolicy", "accept_prob_from_logprobs"]

_MARKER = re.compile(r"VERDICT\s*[:：]\s*$", re.IGNORECASE)


def accept_prob_from_logprobs(tokens: Sequence[Any]) -> float | None:
    """``P(CORRECT) / (P(CORRECT) + P(INCORRECT))`` at the verdict token of a reply.

    Args:
        tokens: the reply's ``choices[0].logprobs.content``: items with ``token``, ``logprob``
            and ``top_logprobs`` (each with ``token`` and ``logprob``), in order.

    Returns:
        The share in [0, 1], or ``None`` when no token follows a ``VERDICT:`` marker or no
        alternative at that position spells either verdict. An alternative counts for a verdict
        when, stripped of spaces, quotes and asterisks and upper-cased, it is a non-empty prefix
        of ``CORRECT`` (accept) or of ``INCORRECT`` (reject); ``IN`` counts as reject only.
    """
    text = ""
    site = None
    for k, item in enumerate(tokens):
        if _MARKER.search(text):
            site = k  # the last marker wins, as the server reads the last VERDICT line
        text += _field(item, "token") or ""
    if site is None:
        return None
    item = tokens[site]
    alternatives = list(_field(item, "top_logprobs") or []) or [item]
    accept = reject = 0.0
    for alternative in alternatives:
        word = (_field(alternative, "token") or "").strip().strip("\"'*").upper()
        logprob = _field(alternative, "logprob")
        if not word or logprob is None:
            continue
        if "INCORRECT".startswith(word):
            reject += math.exp(logprob)
        elif "CORRECT".startswith(word):
            accept += math.exp(logprob)
    if accept + reject == 0.0:
        return None
    return accept / (accept + reject)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


class OpenAIPolicy(Policy):
    """``openai:BASE_URL#MODEL`` (see the module docstring).

    Args:
        spec: the spec text (for reports).
        base_url: the endpoint's base URL, including ``/v1`` (as ``openai`` expects).
        model: the ``model`` field of each request.
        options: timeouts, retries, concurrency, key variable, token prices, ``max_new_tokens``.

    Raises:
        ValueError: ``--api-key-env`` names a variable that is not set.
    """

    def __init__(self, spec: str, base_url: str, model: str, options: PolicyOptions, layout: str = "chat") -> None:
        super().__init__(spec)
        # "tools": the tool-call layout a trained model plays in (openai-tools: specs, openai_tools.py)
        self.tools = None
        if layout == "tools":
            from trainer_client.evaluation.openai_tools import TOOLS_KWARG, ToolConversations, tool_schemas

            self.tools, self.tool_state = tool_schemas(), ToolConversations()
            self.tool_kwargs = {"chat_template_kwargs": {TOOLS_KWARG: self.tools}}
        from openai import AsyncOpenAI

        key = "EMPTY"
        if options.api_key_env:
            key = os.environ.get(options.api_key_env, "")
            if not key:
                raise ValueError(f"--api-key-env {options.api_key_env}: that environment variable is not set")
        self.model, self.options = model, options
        self.client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=options.timeout_s,
                                  max_retries=options.max_retries)
        self.gate = asyncio.Semaphore(options.max_concurrency)

    async def act(self, request: TurnRequest) -> TurnReply:
        if self.tools is not None:
            messages = self.tool_state.messages(request)
            extra: dict[str, Any] = {"tools": self.tools, "tool_choice": "auto",
                                     "extra_body": self.tool_kwargs}
        else:
            messages, extra = [m.model_dump() for m in request.observation.messages], {}
        wants_logprobs = request.want_accept_prob and request.role is Role.VERIFIER
        if wants_logprobs:
            extra.update(logprobs=True, top_logprobs=5)
        self.counters["requests"] += 1
        async with self.gate:
            try:
                response = await self.client.chat.completions.create(
                    model=self.model, messages=messages, temperature=request.temperature,  # type: ignore[arg-type]  # openai types messages as TypedDicts; these are the server's plain chat dicts
                    max_tokens=self.options.max_new_tokens, seed=self._seed(request), **extra)
                choice = validated_choice(response)
            except Exception as exc:  # the openai client has retried; the episode fails (never a wrong answer)
                self.counters["failed"] += 1
                failure = failure_from_exception(exc, timeout_s=self.options.timeout_s,
                                                 max_retries=self.options.max_retries)
                return TurnReply(None, messages, error=failure.describe(), failure=failure)
        content = choice.message.content
        generated = forfeit = None
        if self.tools is not None:
            from trainer_client.rollout.tools import FORFEIT_ACTION

            content, generated = self.tool_state.action(request, messages, choice.message)
            if content == FORFEIT_ACTION and choice.message.tool_calls:  # a call, but not one the role's tool takes
                forfeit = "invalid_tool_call"
        usage = response.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        completion_tokens = usage.completion_tokens if usage else 0
        self.counters["prompt_tokens"] += prompt_tokens
        self.counters["completion_tokens"] += completion_tokens
        content = content or ""  # the model's own blank reply: the runner forfeits the turn, scored
        accept_prob = None
        if wants_logprobs and choice.logprobs is not None and choice.logprobs.content:
            accept_prob = accept_prob_from_logprobs(choice.logprobs.content)
        return TurnReply(content, messages, generated=generated, prompt_tokens=prompt_tokens,
                         completion_tokens=completion_tokens, accept_prob=accept_prob, forfeit=forfeit)

    def episode_done(self, episode_key: str) -> None:
        if self.tools is not None:
            self.tool_state.episode_done(episode_key)

    def _seed(self, request: TurnRequest) -> int:
        """A request seed per (run seed, episode, turn, draw): the N samples of best-of-N and
        self-consistency differ even on endpoints that honour ``seed`` (vLLM), and a rerun
        sends the same seeds."""
        key = f"{request.episode_key}:{request.observation.t}:{request.draw}".encode()
        return (self.options.seed * 1_000_003 + zlib.crc32(key)) % 2**31

    async def aclose(self) -> None:
        await self.client.close()
