"""The debate episode: a pure state machine (no I/O, no asyncio, no grading).

Turn order: solver -> verifier -> (solver revises -> verifier)* -> judge -> done. A round is one
solver turn and the verifier's review of it; the debate goes to the judge as soon as the
verifier accepts (``VERDICT: CORRECT``) or after ``max_rounds`` rounds. With the
circular-critique stop on, it also goes to the judge at once when the solver re-submits an
answer the verifier rejected, or the verifier repeats its previous review (RFC 0006).

In ``single`` mode an episode is one solver turn: the solver answers once and the episode is
over (no verifier, no judge).

Every observation is serialised once, when it is created, and kept: ``observation_at(t)`` returns the
exact bytes that were sent for observation ``t`` (``state(t)``, RFC 0004).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from env_server.debate import prompts
from env_server.debate.answers import answer_key, final_answer, normalize_critique, parse_verdict
from env_server.debate.problems.base import Problem
from env_server.protocol.errors import EpisodeDoneError, InvalidActionError, OutOfRangeError
from env_server.protocol.markers import EpisodeMode, ErrorKind, Role, hint_key
from env_server.protocol.models import DebateAction

__all__ = ["DebateEpisode", "TurnRecord"]


@dataclass(slots=True)
class TurnRecord:
    """One accepted turn, with what was read from it.

    Attributes:
        t: turn index (0-based); the action taken after observation ``t``.
        role, round, content: who said what, in which round.
        answer: solver/judge: the final answer (``answers.final_answer``: the last
            ``\\boxed{}``, or adjacent boxes merged), ``None`` if missing.
        verdict: verifier: ``"CORRECT"``, ``"INCORRECT"`` or ``None`` (missing).
        reviewed_t: verifier: index of the solver turn under review.
        provisional_kind: marker known without grading (missing answer/verdict, repeated
            rejected answer, circular critique), else ``None``.
        circular: the turn repeated a rejected answer or the previous review and, the
            circular-critique stop being on, sent the debate to the judge.
    """

    t: int
    role: Role
    round: int
    content: str
    answer: str | None = None
    verdict: str | None = None
    reviewed_t: int | None = None
    provisional_kind: ErrorKind | None = None
    circular: bool = False

    @property
    def needs_grade(self) -> bool:
        """Whether this turn's answer goes to the grader (solver and judge turns)."""
        return self.role is not Role.VERIFIER


class DebateEpisode:
    """One debate on one problem.

    Args:
        episode_id: the episode's id.
        problem: the problem under debate.
        max_rounds: solver/verifier rounds before the judge closes the debate (>= 1); ``single``
            mode ignores it and keeps 1 (the solver's one turn).
        max_action_chars: longest accepted action content, characters.
        mode: ``debate`` (default) or ``single`` (one solver turn, no verifier or judge).
        circular_stop: go to the judge at once when the solver re-submits a rejected answer
            or the verifier repeats its previous review (RFC 0006). Off by default here (the
            state machine's rules as before); the server turns it on unless
            ``--no-circular-critique-stop``.

    Raises:
        ValueError: ``max_rounds < 1``.
    """

    __slots__ = (
        "_last_review",
        "_observations",
        "_rejected",
        "_transcript",
        "accepted",
        "circular_stop",
        "episode_id",
        "max_action_chars",
        "max_rounds",
        "mode",
        "problem",
        "role",
        "round",
        "turns",
    )

    def __init__(self, episode_id: str, problem: Problem, max_rounds: int, max_action_chars: int,
                 mode: EpisodeMode = EpisodeMode.DEBATE, circular_stop: bool = False) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.episode_id = episode_id
        self.problem = problem
        self.mode = EpisodeMode(mode)
        self.max_rounds = 1 if self.mode is EpisodeMode.SINGLE else max_rounds
        self.max_action_chars = max_action_chars
        self.circular_stop = circular_stop
        self.turns: list[TurnRecord] = []
        self.role: Role | None = Role.SOLVER
        self.round = 0
        self.accepted = False
        self._rejected: set[str] | None = None  # made at the first rejection (most debates have none)
        #: the verifier's last review, normalised (``answers.normalize_critique``)
        self._last_review: str | None = None
        #: transcript entries, built once per turn and shared by every later observation
        self._transcript: list[dict[str, Any]] = []
        self._observations: list[bytes] = [self._reset_observation()]

    # ------------------------------------------------------------------ reading

    @property
    def done(self) -> bool:
        return self.role is None

    @property
    def step_count(self) -> int:
        return len(self.turns)

    @property
    def last_observation(self) -> bytes:
        """The serialised payload of the current observation (what the last reset/step sent)."""
        return self._observations[-1]

    def observation_after(self, t: int) -> bytes:
        """The payload bytes sent as the reply to turn ``t`` (observation ``t + 1``), for a
        re-sent step of a turn already taken.

        Raises:
            OutOfRangeError: turn ``t`` has not been taken.
        """
        if not 0 <= t < self.step_count:
            raise OutOfRangeError(f"turn t={t} has not been taken: the next turn is t={self.step_count}",
                                  t=t, next_t=self.step_count)
        return self._observations[t + 1]

    def observation_at(self, t: int) -> bytes:
        """The exact payload bytes of observation ``t``, as sent when it was created.

        Valid ``t`` are the observations at which a role acted or must act:
        ``0 <= t <= step_count`` while the debate runs, ``0 <= t < step_count`` once done.

        Raises:
            OutOfRangeError: ``t`` outside that range.
        """
        limit = self.step_count - 1 if self.done else self.step_count
        if not 0 <= t <= limit:
            raise OutOfRangeError(f"t={t} is out of range: valid observations are 0..{limit}", t=t, max_t=limit)
        return self._observations[t]

    def state(self) -> dict[str, Any]:
        """OpenEnv state (``episode_id``, ``step_count``) plus this environment's fields."""
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "problem_id": self.problem.problem_id,
            "mode": self.mode.value,
            "role": self.role.value if self.role else None,
            "round": self.round,
            "max_rounds": self.max_rounds,
            "done": self.done,
        }

    # ------------------------------------------------------------------ acting

    def step(self, action: DebateAction) -> TurnRecord:
        """Apply the acting role's action.

        Returns:
            The accepted turn (its answer/verdict extracted, provisional marker set).

        Raises:
            EpisodeDoneError: the debate is over.
            InvalidActionError: wrong role (``role_mismatch``), empty content
                (``empty_response``) or content over ``max_action_chars`` (``too_long``).
                The episode does not change.
        """
        role = self.role
        if role is None:
            raise EpisodeDoneError("the debate is over: reset to start a new episode")
        if action.role is not role:
            raise InvalidActionError(
                f"it is the {role.value}'s turn, not the {action.role.value}'s", ErrorKind.ROLE_MISMATCH, role
            )
        content = action.content
        if not content.strip():
            raise InvalidActionError("empty content", ErrorKind.EMPTY_RESPONSE, role)
        if len(content) > self.max_action_chars:
            raise InvalidActionError(
                f"content has {len(content)} characters, more than the limit of {self.max_action_chars}",
                ErrorKind.TOO_LONG, role,
            )
        turn = TurnRecord(t=len(self.turns), role=role, round=self.round, content=content)
        if role is Role.SOLVER:
            self._solver_turn(turn)
        elif role is Role.VERIFIER:
            self._verifier_turn(turn)
        else:
            turn.answer = final_answer(content)
            if turn.answer is None:
                turn.provisional_kind = ErrorKind.MISSING_FINAL_ANSWER
            self.role = None
        self.turns.append(turn)
        # enum members, not ``.value`` (a slow property on CPython 3.11): orjson writes a member
        # as its value, so the bytes are the same
        self._transcript.append({"t": turn.t, "role": role, "round": turn.round, "content": content})
        self._observations.append(self._serialize(turn))
        if self.role is None:
            # no observation follows: the transcript entries go now, while in cache, rather than
            # when the retained episode is dropped (``benchmarks/README.md``, "After the hot-path changes")
            self._transcript.clear()
        return turn

    def _solver_turn(self, turn: TurnRecord) -> None:
        turn.answer = final_answer(turn.content)
        if turn.answer is None:
            turn.provisional_kind = ErrorKind.MISSING_FINAL_ANSWER
        elif self._rejected is not None and answer_key(turn.answer) in self._rejected:
            turn.provisional_kind = ErrorKind.REPEATED_REJECTED_ANSWER
            turn.circular = self.circular_stop
        if self.mode is EpisodeMode.SINGLE:
            self.role = None
        elif turn.circular:
            self.role = Role.JUDGE  # the verifier already rejected this answer: no review again
        else:
            self.role = Role.VERIFIER

    def _verifier_turn(self, turn: TurnRecord) -> None:
        reviewed = self.turns[-1]
        turn.reviewed_t = reviewed.t
        turn.verdict = parse_verdict(turn.content)
        review, self._last_review = self._last_review, normalize_critique(turn.content)
        if turn.verdict is None:
            turn.provisional_kind = ErrorKind.MISSING_VERDICT
        if turn.verdict == "CORRECT":
            self.accepted = True
            self.role = Role.JUDGE
            return
        if reviewed.answer is not None:
            if self._rejected is None:
                self._rejected = set()
            self._rejected.add(answer_key(reviewed.answer))
        if self.circular_stop and review == self._last_review:
            turn.circular = True
            turn.provisional_kind = turn.provisional_kind or ErrorKind.CIRCULAR_CRITIQUE
            self.role = Role.JUDGE
        elif self.round + 1 < self.max_rounds:
            self.round += 1
            self.role = Role.SOLVER
        else:
            self.role = Role.JUDGE

    # ------------------------------------------------------------------ observations

    def _messages(self) -> list[dict[str, str]]:
        if self.role is None:
            return []
        problem = self.problem.problem
        if self.mode is EpisodeMode.SINGLE:
            return prompts.single_solver_messages(problem)
        solver = [t.content for t in self.turns if t.role is Role.SOLVER]
        reviews = [t.content for t in self.turns if t.role is Role.VERIFIER]
        if self.role is Role.SOLVER:
            return prompts.solver_messages(problem, solver, reviews)
        if self.role is Role.VERIFIER:
            return prompts.verifier_messages(problem, solver, reviews)
        return prompts.judge_messages(problem, [(t.role, t.round, t.content) for t in self.turns])

    def _reset_observation(self) -> bytes:
        """The reset observation: :meth:`_serialize` ``(None)``'s bytes, from a per-problem
        template with this episode's id spliced in (it is the only part that differs)."""
        parts = None if self.episode_id is _TEMPLATE_ID else _reset_template(self.problem, self.max_rounds, self.mode)
        if parts is None:
            return self._serialize(None)
        return orjson.dumps(self.episode_id).join(parts)

    def _serialize(self, turn: TurnRecord | None) -> bytes:
        """Build and serialise the observation after ``turn`` (``None``: the reset one).

        Enum members go in as they are, not as ``.value`` (a slow property on CPython 3.11):
        orjson writes a member as its value."""
        metadata: dict[str, Any]
        if turn is None:
            metadata = {"episode_id": self.episode_id, "turn": None, "role": None, "error_kind": None,
                        "hint_template_key": None, "circular_critique": False, "grading": "none"}
        else:
            kind = turn.provisional_kind
            metadata = {"episode_id": self.episode_id, "turn": turn.t, "role": turn.role, "error_kind": kind,
                        "hint_template_key": None if kind is None else hint_key(turn.role, kind),
                        "circular_critique": turn.circular, "grading": "pending"}
        payload = {
            "observation": {
                "episode_id": self.episode_id,
                "problem_id": self.problem.problem_id,
                "problem": self.problem.problem,
                "mode": self.mode,
                "role": self.role,
                "t": len(self.turns),
                "round": self.round,
                "max_rounds": self.max_rounds,
                "messages": self._messages(),
                "transcript": self._transcript,
                # inside the observation and at top level, as openenv 0.10 sends it
                "metadata": metadata,
            },
            "reward": None,
            "done": self.role is None,
            "metadata": metadata,
        }
        return orjson.dumps(payload)


#: the episode id of template episodes (compared by identity)
_TEMPLATE_ID = "\x00mathdebate-episode-id\x00"


@lru_cache(maxsize=4096)
def _reset_template(problem: Problem, max_rounds: int, mode: EpisodeMode) -> tuple[bytes, ...] | None:
    """The reset observation of ``problem`` split around its episode id, or ``None`` when the
    id's encoding is not found exactly where the id goes (three places).

    Every reset observation of a problem is the same but for the episode id; building it took
    about a tenth of a cached-grade episode's server time. Tests check the spliced bytes
    against :meth:`DebateEpisode._serialize`.
    """
    template = DebateEpisode(_TEMPLATE_ID, problem, max_rounds, max_action_chars=1, mode=mode)
    parts = template.last_observation.split(orjson.dumps(_TEMPLATE_ID))
    return tuple(parts) if len(parts) == 4 else None
