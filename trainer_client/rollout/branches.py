"""Branching a rollout at a state: ``K`` actions sampled from one observation (``advantage_estimator:
grpo_state``, :mod:`trainer_client.credit.state_groups` for the advantages).

In each generation round of TRL's tool loop (trl 1.16 ``_tool_call_loop``: one round per turn),
every rollout whose due turn is **branched** (the verifier's review; the solver's revision, ``t >
0``) gets ``K − 1`` more samples of that turn from the same prompt (TRL's own generation, at the
branch temperature when one is set). Each of the ``K`` actions is played by the server on a fork of
the rollout's session (RFC 0007, ``EpisodeTrace.grade_branches``) and graded there; the rollout
goes on with one of them (``continuation``: its own sample, or the best graded). After scoring,
the ``K − 1`` actions the rollout did not continue with are appended to TRL's batch as rows of
their own (:func:`trainer_client.credit.state_groups.append_branch_rows`), so TRL's loss trains
every branch with its within-state advantage.

How a sample becomes an action is how the rollout's own does (trl 1.16 ``parse_response``, then
the environment's tool): a valid call of the role's tool is that tool's action; a reply without a
tool call is its text (the fallback of a rollout that stops calling tools); anything else (a call
of another tool, wrong arguments, a blank reply) is the forfeit placeholder: a branch has one try.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation
from trainer_client.rollout.rows import RowTracker
from trainer_client.rollout.tools import FORFEIT_ACTION, TOOL_ARGUMENTS, action_content

__all__ = ["Continuation", "StateBranch", "StateBrancher", "StateGroup", "StateSettings", "branched",
           "choose_continuation", "reply_action"]

Continuation = Literal["sampled", "best"]


@dataclass(frozen=True)
class StateBranch:
    """One action sampled from a state.

    Attributes:
        completion_ids: the action's generated token ids (what the model wrote for the turn).
        action: the action the server played (:func:`reply_action` of the parsed reply).
        reward: the server's reward of the turn played with this action, ``None`` when the
            branch could not be graded (a fork refused, a server gone).
        continued: whether this action is the one the rollout went on with.
    """

    completion_ids: tuple[int, ...]
    action: str
    reward: float | None
    continued: bool


@dataclass(frozen=True)
class StateGroup:
    """The ``K`` actions sampled from one rollout's observation at one turn.

    Attributes:
        row: the rollout's row in this process's batch.
        t: the turn (the observation index the branches start from).
        role: the acting role.
        context_ids: the prompt every action was sampled after (the rollout's prompt and its
            completion so far, tool results included), token ids.
        branches: the ``K`` actions, exactly one with ``continued``.
    """

    row: int
    t: int
    role: Role
    context_ids: tuple[int, ...]
    branches: tuple[StateBranch, ...]


def choose_continuation(rewards: Sequence[float | None], how: Continuation) -> int:
    """Which of ``K`` actions the rollout continues with: ``"sampled"``: index 0 (the rollout's
    own sample); ``"best"``: the highest graded reward, the first of equals (index 0 when none
    was graded).

    Raises:
        ValueError: an unknown ``how`` or no rewards.
    """
    if how not in ("sampled", "best"):
        raise ValueError(f"continuation must be 'sampled' or 'best', got {how!r}")
    if not rewards:
        raise ValueError("no actions to continue with")
    if how == "sampled":
        return 0
    graded = [(r, -k) for k, r in enumerate(rewards) if r is not None]
    return -max(graded)[1] if graded else 0



class StateSettings(BaseModel):
    """``grpo_state``'s settings (the ``state`` section of the train config).

    Attributes:
        branches: ``K``, actions sampled from each branched state (the rollout's own included), ≥ 2.
        continuation: ``"sampled"`` (the rollout goes on with its own sample) or ``"best"`` (with
            the best graded one, AT-GRPO's choice).
        temperature: the branches' sampling temperature; ``None``: the rollouts'.
    """

    model_config = ConfigDict(extra="forbid")

    branches: int = Field(default=4, ge=2, le=64)
    continuation: Continuation = "sampled"
    temperature: float | None = Field(default=None, gt=0)


def branched(observation: DebateObservation | None) -> bool:
    """Whether the turn due at ``observation`` is branched: the verifier's, or a solver's revision."""
    if observation is None or observation.role is None:
        return False
    return observation.role is Role.VERIFIER or (observation.role is Role.SOLVER and observation.t > 0)


def reply_action(message: dict[str, Any], role: Role) -> str:
    """The action a parsed reply (TRL's ``{"content", "tool_calls"}``) is for ``role``'s turn
    (module docstring): the tool's action, the text, or :data:`FORFEIT_ACTION`."""
    calls = message.get("tool_calls") or []
    if calls:
        function = calls[0].get("function") or {}
        tool_role, names = TOOL_ARGUMENTS.get(function.get("name") or "", (None, ()))
        arguments = function.get("arguments")
        if (tool_role is role and isinstance(arguments, dict) and set(arguments) == set(names)
                and all(isinstance(arguments[n], str) for n in names)):
            content = action_content(function["name"], arguments)
            return content[:4096] if content.strip() else FORFEIT_ACTION
        return FORFEIT_ACTION
    text = message.get("content")
    return text.strip() if isinstance(text, str) and text.strip() else FORFEIT_ACTION


class StateBrancher:
    """Samples and grades the branches of every branched turn of a generation batch.

    Args:
        settings: :class:`StateSettings`.
        parse: ``(completion_ids, prefix_ids) -> message`` (TRL's ``parse_response`` as TRL calls it).
        temperature: ``T -> context manager`` under which TRL's generation samples at ``T``.
        max_completion_length: TRL's completion budget, tokens (a branch is cut to what is left
            of it, as TRL cuts a rollout's turn).
    """

    def __init__(self, settings: StateSettings, parse: Callable[[list[int], list[int]], dict[str, Any]],
                 temperature: Callable[[float], contextlib.AbstractContextManager[None]],
                 max_completion_length: int) -> None:
        self.settings, self._parse, self._temperature = settings, parse, temperature
        self._max_completion_length = max_completion_length
        self._tracker = RowTracker()
        self._prompt_lengths: list[int] = []
        #: this batch's state groups, in the order they were sampled
        self.groups: list[StateGroup] = []

    def start_rollouts(self) -> None:
        """A new generation batch."""
        self._tracker.start()
        self._prompt_lengths = []
        self.groups = []

    @property
    def extra_tokens(self) -> int:
        """Tokens sampled for branches the rollouts did not continue with (this batch)."""
        return sum(len(b.completion_ids) for g in self.groups for b in g.branches if not b.continued)

    def generate_round(self, prompt_ids: list[list[int]], environments: Sequence[Any],
                       generate: Callable[[list[list[int]]], tuple[list[list[int]], Any]]) -> tuple[list[list[int]], Any]:
        """One round of TRL's loop: every rollout's sample, and for each rollout at a branched
        turn ``K − 1`` more, graded on forks; returns ``(completion_ids, logprobs)`` with each
        branched rollout's continuation in its place."""
        rows = self._tracker.rows(prompt_ids)
        if not self._prompt_lengths:
            self._prompt_lengths = [len(ids) for ids in prompt_ids]
        ids, logprobs = generate(prompt_ids)
        ids, logprobs = [list(x) for x in ids], (list(logprobs) if logprobs is not None else None)
        due = [i for i, row in enumerate(rows) if branched(environments[row].trace.observation)]
        extra_n = self.settings.branches - 1
        if due:
            contexts = [prompt_ids[i] for i in due for _ in range(extra_n)]
            with self._temperature_of_branches():
                extra, extra_logprobs = generate(contexts)
            for j, i in enumerate(due):
                picked, candidates = self._branch(rows[i], prompt_ids[i],
                                                  [ids[i], *extra[j * extra_n:(j + 1) * extra_n]], environments[rows[i]])
                if picked > 0:
                    ids[i] = candidates[picked]
                    if logprobs is not None:
                        logprobs[i] = extra_logprobs[j * extra_n + picked - 1] if extra_logprobs is not None else None
        self._tracker.advance(rows, prompt_ids, ids)
        return ids, logprobs

    @contextlib.contextmanager
    def _temperature_of_branches(self) -> Iterator[None]:
        if self.settings.temperature is None:
            yield
        else:
            with self._temperature(self.settings.temperature):
                yield

    def _branch(self, row: int, context: list[int], candidates: list[list[int]],
                environment: Any) -> tuple[int, list[list[int]]]:
        """Grade ``candidates`` (the rollout's own first) on forks, record their state group and
        return the index of the one the rollout continues with and the candidates (cut to the
        completion budget)."""
        observation = environment.trace.observation
        budget = self._max_completion_length - (len(context) - self._prompt_lengths[row])
        candidates = [list(c[:max(budget, 0)]) for c in candidates]
        actions = [reply_action(self._parse(c, context), observation.role) for c in candidates]
        grades = environment.trace.grade_branches(actions)
        rewards = [grade.reward if grade is not None else None for grade in grades]
        picked = choose_continuation(rewards, self.settings.continuation)
        self.groups.append(StateGroup(row, observation.t, observation.role, tuple(context), tuple(
            StateBranch(tuple(c), a, r, k == picked)
            for k, (c, a, r) in enumerate(zip(candidates, actions, rewards, strict=True)))))
        return picked, candidates
