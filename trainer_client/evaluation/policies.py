"""Policies that play a debate role in ``mathdebate eval``, and the ``--policy`` spec syntax.

A policy answers one :class:`TurnRequest` (a role's observation, sent by the env server) with
a :class:`TurnReply` (the action text, or a failure that the runner turns into a forfeited
turn). Specs:

- ``scripted:reference`` and ``scripted:noisy[:P]`` (P = error probability, default 0.3): the
  rule-based debaters of ``mathdebate play`` (:class:`env_server.play.ScriptedDebaters`). They
  are oracles: they read the problem's reference solution and answer from the problem source;
  a scripted verifier judges the answer under review with the server's grader and errs with
  probability P/2. Draws are seeded per (run seed, episode, turn, draw), so a run is
  reproducible whatever the concurrency;
- ``hf:PATH`` (a local transformers checkpoint, e.g. ``final/`` of ``mathdebate train``; also
  ``hf:tiny`` / ``hf:tiny-learning``, the offline tiny models):
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from env_server.answers import final_answer
from env_server.models import DebateObservation, Role
from env_server.play import ScriptedDebaters
from env_server.problems import ProblemSource

__all__ = ["Policy", "PolicyOptions", "ScriptedPolicy", "TurnReply", "TurnRequest", "build_policies", "parse_policy"]


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
            forfeits the turn and counts it).
        messages: what the policy was given, as chat messages (for ``trajectories.jsonl``).
        generated: the policy's raw output when it differs from ``content`` (a tool call).
        prompt_tokens, completion_tokens: token counts (the endpoint's usage, or the local
            tokenizer's).
        accept_prob: for a verifier turn, P(CORRECT) / (P(CORRECT) + P(INCORRECT)) from the
            verdict token's log-probabilities, when the policy has them (``None`` otherwise).
        error: why the request failed.
    """

    content: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    generated: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    accept_prob: float | None = None
    error: str | None = None


class Policy(ABC):
    """Plays turns. Subclasses implement :meth:`act`; ``counters`` holds ``requests``,
    ``failed``, ``prompt_tokens`` and ``completion_tokens`` (and ``retries`` where known)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.counters: Counter[str] = Counter()

    @abstractmethod
    async def act(self, request: TurnRequest) -> TurnReply:
        """Play one turn. Must not raise for a failed model call: return ``content=None``."""

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
        from trainer_client.heldout import grade_answer_text

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


def parse_policy(spec: str, options: PolicyOptions) -> Policy:
    """Build the policy a spec names (see the module docstring).

    Raises:
        ValueError: an unknown or malformed spec, or ``openai:`` without a model name.
    """
    kind, _, rest = spec.partition(":")
    if kind == "scripted":
        name, _, p = rest.partition(":")
        try:
            probability = float(p) if p else (0.3 if name == "noisy" else 0.0)
        except ValueError:
            raise ValueError(f"bad error probability in {spec!r}") from None
        return ScriptedPolicy(spec, name, probability, options)
    if kind == "hf" and rest:
        from trainer_client.evaluation.hf_policy import HFPolicy

        return HFPolicy(spec, rest, options)
    if kind in ("openai", "openai-tools") and rest:
        from trainer_client.evaluation.openai_policy import OpenAIPolicy

        base_url, _, model = rest.partition("#")
        model = model or options.model or ""
        if not model:
            raise ValueError(f"{spec!r} names no model: write {kind}:URL#MODEL or pass --model NAME")
        return OpenAIPolicy(spec, base_url, model, options, layout="tools" if kind == "openai-tools" else "chat")
    raise ValueError(f"unknown policy {spec!r}: use scripted:reference, scripted:noisy[:P], hf:PATH, openai:URL[#MODEL] "
                     "or openai-tools:URL[#MODEL]")


def build_policies(default: str | None, per_role: dict[Role, str | None], options: PolicyOptions,
                   roles: Sequence[Role] = tuple(Role)) -> dict[Role, Policy]:
    """One policy per role in ``roles`` (the roles the run plays): the role's own spec, else
    ``default``. Roles with the same spec share one instance (one model load, one client, one
    set of counters).

    Raises:
        ValueError: a role with no spec, or a bad spec.
    """
    specs: dict[Role, str] = {}
    for role in roles:
        spec = per_role.get(role) or default
        if not spec:
            raise ValueError(f"no policy for the {role.value}: pass --policy or --policy-{role.value}")
        specs[role] = spec
    built: dict[str, Policy] = {}
    for spec in dict.fromkeys(specs.values()):
        built[spec] = parse_policy(spec, options)
    return {role: built[spec] for role, spec in specs.items()}
