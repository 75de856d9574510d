"""A role played by an OpenAI-compatible endpoint inside TRL's tool loop (``policies.<role>.endpoint``).

TRL's loop wants token ids from every generation round. For the rows whose turn belongs to an
endpoint role, :class:`EndpointPlayer` asks the endpoint (the official ``openai`` client, its
own retries and timeout; the requests of one round run concurrently on threads) and writes the
reply as the assistant message the trained model would have produced: a call of the role's
tool, rendered by the trainer's chat template (:func:`tool_call_ids`). TRL then parses that call
and runs it against the environment like any other, so the debate goes on; the tokens stay in
the completion and are masked out of every loss (an endpoint role is never trained).

Layouts, as in ``mathdebate eval``: ``openai:`` sends the role's chat exactly as the env server
built it (``observation.messages``) and reads the reply's text as the action: the solver's
solution, the verifier's critique with its last ``VERDICT:`` line as the verdict, the judge's
answer; ``openai-tools:`` sends the tool-call layout (:func:`~trainer_client.rollout.tool_calls.turn_messages`,
the tools' schemas) and takes the reply's call of the role's tool, else its text as above.

A request that fails for good (after the client's retries: an HTTP error, a timeout, a dropped
connection, a malformed reply) is not an answer (``docs/failures.md``): its turn is written as
the forfeit placeholder without a tool call, so TRL's loop ends that rollout, and the failure is
recorded, typed with the server's message, in :attr:`EndpointPlayer.last_failures` (per
observation of the last :meth:`EndpointPlayer.play`) and :attr:`EndpointPlayer.failures`. The
router marks the rollout failed and the trainer drops it from its group (the reward
pipeline's step 4, :func:`trainer_client.credit.pipeline.drop_failed_rollouts`): it is never
scored as the model's forfeit.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from env_server.client.failures import FailureTally, RequestFailure
from env_server.debate.answers import VERDICT_PATTERN, parse_verdict
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation
from trainer_client.policies.settings import parse_endpoint
from trainer_client.rollout.tool_calls import reply_tool_call, tool_schemas, turn_messages
from trainer_client.rollout.tools import FORFEIT_ACTION, TOOL_ARGUMENTS, TOOL_FOR_ROLE

__all__ = ["EndpointPlayer", "text_arguments", "tool_call_ids"]


def text_arguments(role: Role, text: str) -> dict[str, str]:
    """The role's tool arguments read from a plain-text reply: ``solution`` (the solver), ``verdict``
    and ``critique`` (the verifier: the last ``VERDICT:`` line, the text before it; no verdict
    line reads as ``INCORRECT``), ``answer`` (the judge)."""
    if role is Role.SOLVER:
        return {"solution": text}
    if role is Role.VERIFIER:
        verdict = parse_verdict(text) or "INCORRECT"
        marks = list(VERDICT_PATTERN.finditer(text))
        critique = text[:marks[-1].start()].strip() if marks else text
        return {"verdict": verdict, "critique": critique or text}
    return {"answer": text}


def tool_call_ids(processor: Any, name: str, arguments: dict[str, Any], eos_token_id: int | None,
                  **template_kwargs: Any) -> list[int]:
    """The token ids of an assistant message calling tool ``name`` with ``arguments``, as the
    chat template renders it after the generation prompt, up to and including the end-of-turn
    token ``eos_token_id`` (:func:`~trainer_client.losses.replay_pairs.tool_call_response_ids`;
    ``template_kwargs``: the trainer's ``chat_template`` and ``chat_template_kwargs``).

    Raises:
        ValueError: the template is not prefix-preserving.
    """
    from trainer_client.losses.replay_pairs import tool_call_response_ids

    message = {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
    kwargs = dict(template_kwargs)
    chat_template = kwargs.pop("chat_template", None)
    return tool_call_response_ids(processor, message, chat_template=chat_template, eos_token_id=eos_token_id,
                                  template_kwargs=kwargs)


class EndpointPlayer:
    """Plays the turns of endpoint roles (see the module docstring).

    Args:
        specs: role -> ``openai:BASE_URL#MODEL`` (or ``openai-tools:``).
        processor: the trainer's tokenizer (renders the replies as tokens; or later, :meth:`bind`).
        template_kwargs: ``apply_chat_template`` keywords (the trainer's ``chat_template``...).
        temperature, max_tokens, timeout_s, max_retries: every request's settings.
        api_key_env: the environment variable with the key (``EMPTY`` without one, as local
            servers accept).

    Attributes:
        counters: ``requests`` and ``failures`` per role (``"judge/requests"``...).
        failures: every request and the failed ones, typed with the server's message.
        last_failures: per observation of the last :meth:`play`, its failure or ``None``.
    """

    def __init__(self, specs: dict[Role, str], processor: Any = None, template_kwargs: dict[str, Any] | None = None, *,
                 temperature: float = 1.0, max_tokens: int = 512, timeout_s: float = 60.0, max_retries: int = 3,
                 api_key_env: str | None = None) -> None:
        from openai import OpenAI

        self.specs = {Role(role): parse_endpoint(spec) for role, spec in specs.items()}
        key = (os.environ.get(api_key_env) if api_key_env else None) or "EMPTY"
        self.clients = {url: OpenAI(base_url=url, api_key=key, timeout=timeout_s, max_retries=max_retries)
                        for _, url, _ in self.specs.values()}
        self.processor, self.template_kwargs = processor, dict(template_kwargs or {})
        self.temperature, self.max_tokens = temperature, max_tokens
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.counters: Counter[str] = Counter()
        self.failures = FailureTally()
        self.last_failures: list[RequestFailure | None] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="policy-endpoint")

    def bind(self, processor: Any, **template_kwargs: Any) -> None:
        """Render replies with ``processor`` and these ``apply_chat_template`` keywords (the
        trainer's: its ``chat_template`` is known once TRL has built it)."""
        self.processor, self.template_kwargs = processor, template_kwargs

    def play(self, observations: list[DebateObservation]) -> list[list[int]]:
        """One turn per observation (each of an endpoint role), as token ids; the requests run
        concurrently, the replies are rendered on the calling thread (the trainer's fast
        tokenizer is not thread-safe: "Already borrowed"). A failed request is not raised: its
        turn is the forfeit placeholder and its failure is in :attr:`last_failures` (see the
        module docstring)."""
        replies = list(self._pool.map(self._request, observations))
        self.last_failures = [failure for _, _, failure in replies]
        return [self._text_ids(FORFEIT_ACTION) if tool is None
                else tool_call_ids(self.processor, tool, arguments, self._eos(), **self.template_kwargs)
                for tool, arguments, _ in replies]

    def _request(self, observation: DebateObservation) -> tuple[str | None, dict[str, Any], RequestFailure | None]:
        """The endpoint's reply to one turn as ``(tool, arguments, None)``; ``(None, {},
        failure)`` when the request failed (after the client's retries). Runs on the pool: no
        tokenizer here."""
        from trainer_client.request_failures import failure_from_exception, validated_choice

        role = observation.role
        assert role is not None and role in self.specs, "only endpoint roles' turns come here"
        kind, url, model = self.specs[role]
        self._count(f"{role.value}/requests")
        self.failures.request()
        tool = TOOL_FOR_ROLE[role]
        chat = [m.model_dump() for m in observation.messages]
        extra: dict[str, Any] = {}
        if kind == "openai-tools":
            chat = turn_messages(role, chat)
            extra = {"tools": tool_schemas(), "tool_choice": "auto"}
        try:
            response = self.clients[url].chat.completions.create(
                model=model, messages=chat, temperature=self.temperature, max_tokens=self.max_tokens, **extra)  # type: ignore[arg-type]  # plain chat dicts
            message = validated_choice(response).message
        except Exception as exc:  # the client has retried: not an answer; the rollout fails, the run goes on
            self._count(f"{role.value}/failures")
            failure = failure_from_exception(exc, timeout_s=self.timeout_s, max_retries=self.max_retries)
            self.failures.fail(failure)
            return None, {}, failure
        text, name, arguments = reply_tool_call(message)
        names = TOOL_ARGUMENTS[tool][1]
        if not (name == tool and isinstance(arguments, dict) and set(arguments) == set(names)):
            arguments = text_arguments(role, text)
        return tool, arguments, None

    def _count(self, key: str) -> None:
        with self._lock:
            self.counters[key] += 1

    def _eos(self) -> int | None:
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        return tokenizer.eos_token_id

    def _text_ids(self, text: str) -> list[int]:
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])

    def close(self) -> None:
        """Stop the request threads and close the clients."""
        self._pool.shutdown(wait=False)
        for client in self.clients.values():
            client.close()
