"""Policies that play a debate role in ``mathdebate eval``, and the ``--policy`` spec syntax.

A policy answers one :class:`TurnRequest` (a role's observation, sent by the env server) with
a :class:`TurnReply`: the action text, or a typed request failure, which fails the episode (the
runner leaves it out of every accuracy: a request that failed is not an answer). Specs:

- ``scripted:reference`` and ``scripted:noisy[:P]`` (P = error probability, default 0.3): the
  rule-based debaters of ``mathdebate play`` (:class:`env_server.client.play.ScriptedDebaters`). They
  are oracles: they read the problem's reference solution and answer from the problem source;
  a scripted verifier judges the answer under review with the server's grader and errs with
  probability P/2. Draws are seeded per (run seed, episode, turn, draw), so a run is
  reproducible whatever the concurrency;
- ``hf:PATH`` (a local transformers checkpoint, e.g. ``final/`` of ``mathdebate train``; also
  ``hf:tiny`` / ``hf:tiny-learning``, the offline tiny models; ``hf:DIR#ADAPTER``: the role
  adapter ``DIR/ADAPTER`` of a run with per-role policies, on its base model):
  :class:`~trainer_client.evaluation.hf_policy.HFPolicy`;
- ``openai:BASE_URL[#MODEL]`` (any ``/v1/chat/completions`` endpoint):
  :class:`~trainer_client.evaluation.openai_policy.OpenAIPolicy`; ``openai-tools:BASE_URL[#MODEL]``
  plays in the tool-call layout a model trained by ``mathdebate train`` expects
  (:mod:`~trainer_client.evaluation.openai_tools`).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from env_server.client.failures import RequestFailure
from env_server.client.play import ScriptedDebaters
from env_server.debate.answers import final_answer
from env_server.debate.problems import ProblemSource
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation

__all__ = ["Policy", "PolicyOptions", "ScriptedPolicy", "TurnReply", "TurnRequest"]


@dataclass(frozen=True)
class TurnRequest:
    """One turn to play.

    Attributes:
        role: the acting role (the observation's).
        observation: what the server sent for this turn (its ``messages`` are the role's chat).
        episode_key: unique per played episode (per-episode state, seeds).
        temperature: sampling temperature; 0 = greedy.
        draw: index of this draw among several on the same observation (seeds).
        want_accept_prob: a verifier turn whose P(CORRECT) the caller would like (best-of-N).
    """

    role: Role
    observation: DebateObservation
    episode_key: str
    temperature: float = 0.0
    draw: int = 0
    want_accept_prob: bool = False


@dataclass
class TurnReply:
    """A policy's answer to a :class:`TurnRequest`.

    Attributes:
        content: the action text to submit; ``None`` when the request failed (the runner
            fails the episode and counts it). A blank text is the model's own empty answer:
            the runner submits the forfeit placeholder, and the episode is scored.
        messages: what the policy was given, as chat messages (for ``trajectories.jsonl``).
        generated: the policy's raw output when it differs from ``content`` (a tool call).
        prompt_tokens, completion_tokens: token counts (the endpoint's usage, or the local
            tokenizer's).
        accept_prob: for a verifier turn, P(CORRECT) / (P(CORRECT) + P(INCORRECT)) from the
            verdict token's log-probabilities, when the policy has them (``None`` otherwise).
        error: why the request failed (one line).
        failure: the typed failure when ``content`` is ``None`` (its reason and the first
            lines of the server's message).
        forfeit: the model's own forfeit when its reply gives no action: ``invalid_tool_call``
            (a call the role's tool does not accept, and no text); ``None`` otherwise.
    """

    content: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    generated: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    accept_prob: float | None = None
    error: str | None = None
    failure: RequestFailure | None = None
    forfeit: str | None = None


class Policy(ABC):
    """Plays turns. Subclasses implement :meth:`act`; ``counters`` holds ``requests``,
    ``failed``, ``prompt_tokens`` and ``completion_tokens`` (and ``retries`` where known)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.counters: Counter[str] = Counter()

    @abstractmethod
    async def act(self, request: TurnRequest) -> TurnReply:
        """Play one turn. Must not raise for a failed model call: return ``content=None`` with
        its ``failure``."""

    def episode_done(self, episode_key: str) -> None:  # noqa: B027  optional hook with a no-op default
        """Forget any per-episode state (called once an episode is over)."""

    async def aclose(self) -> None:  # noqa: B027  optional hook with a no-op default
        """Release clients and models."""


@dataclass(frozen=True)
class PolicyOptions:
    """Options shared by the policies a run builds.

    Attributes:
        source: the problem source the server serves (scripted policies read reference
            solutions from it).
        seed: the run's seed (scripted draws, endpoint ``seed``, torch sampling).
        model: the endpoint's model name when the spec has no ``#MODEL``.
        api_key_env: name of the environment variable holding the endpoint's key.
        timeout_s: per-request timeout of endpoint calls, seconds.
        max_retries: retries of a failed endpoint call (the ``openai`` client's backoff).
        max_concurrency: endpoint requests in flight at once, per policy.
        max_new_tokens: longest generated turn (tokens).
        cost_per_million: ``(input, output)`` price per million tokens, for the cost counter.
        batch_size: a local model's generation batch (requests gathered across episodes).
    """

    source: ProblemSource
    seed: int = 0
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 3
    max_concurrency: int = 16
    max_new_tokens: int = 512
    cost_per_million: tuple[float, float] = (0.0, 0.0)
    batch_size: int = 16


class ScriptedPolicy(Policy):
    """``scripted:reference`` / ``scripted:noisy[:P]`` (see the module docstring).

    Raises:
        ValueError: P outside [0, 1].
    """

    def __init__(self, spec: str, kind: str, p: float, options: PolicyOptions) -> None:
        super().__init__(spec)
        if kind not in ("reference", "noisy"):
            raise ValueError(f"unknown scripted policy {kind!r}: use scripted:reference or scripted:noisy[:P]")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"scripted:noisy needs P in [0, 1], got {p}")
        self.kind, self.p, self.options = kind, p, options

    def _debaters(self, request: TurnRequest) -> ScriptedDebaters:
        key = f"{self.options.seed}:{request.episode_key}:{request.observation.t}:{request.draw}"
        return ScriptedDebaters(self.kind, self.p, self.options.source, random.Random(key))  # type: ignore[arg-type]  # kind is checked against the Literal's values in __init__

    async def act(self, request: TurnRequest) -> TurnReply:
        from trainer_client.evaluation.heldout import grade_answer_text

        self.counters["requests"] += 1
        observation = request.observation
        debaters = self._debaters(request)
        problem = self.options.source.get(observation.problem_id)
        if request.role is Role.SOLVER:
            content, _ = debaters.solver(problem)
        elif request.role is Role.VERIFIER:
            under_review = [t for t in observation.transcript if t.role is Role.SOLVER][-1].content
            content = debaters.verifier(grade_answer_text(problem.answer, final_answer(under_review)))
        else:
            content = debaters.judge(observation)
        return TurnReply(content, [m.model_dump() for m in observation.messages])
