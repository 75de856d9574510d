"""Wire and domain types, in one place: imported by the server, the clients and the trainer.

Shapes follow OpenEnv (openenv-core 0.3.0): an observation travels as
``{"observation": {...}, "reward": float | None, "done": bool, "metadata": {...}}`` where the
inner ``observation`` is the observation model minus ``reward``, ``done`` and ``metadata``.
Unlike openenv-core 0.3.0 the metadata is sent (top level, as openenv 0.10 does).

Everything here is pydantic v2; the server builds hot-path payloads as plain dicts that
validate against these models (a test checks that), and serialises them with orjson.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from env_server.protocol.markers import EpisodeMode, ErrorKind, Role

__all__ = [
    "AUTH_TOKEN_ENV",
    "AttachData",
    "AttachFrame",
    "ClientFrame",
    "CloseFrame",
    "CounterfactualFacts",
    "DebateAction",
    "DebateObservation",
    "DebateState",
    "EpisodeRewards",
    "ErrorCode",
    "Message",
    "OpenFrame",
    "PingFrame",
    "ResetFrame",
    "ResetRequest",
    "RewardsFrame",
    "RewardsQuery",
    "RewardsStatus",
    "StateFrame",
    "StateQuery",
    "StepFrame",
    "StepPayload",
    "Turn",
    "TurnReward",
]


class ErrorCode(str, Enum):
    """Error codes in ``{"type": "error", "data": {"code": ..., "message": ...}}`` frames.

    The first seven are OpenEnv's (``/ws`` uses only those); the rest belong to ``/ws/mux``
    (RFC 0001) and the HTTP routes.
    """

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"
    # extensions
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    INVALID_ACTION = "INVALID_ACTION"
    UNKNOWN_SESSION = "UNKNOWN_SESSION"
    RESUME_DENIED = "RESUME_DENIED"
    UNAUTHORIZED = "UNAUTHORIZED"
    NO_EPISODE = "NO_EPISODE"
    EPISODE_DONE = "EPISODE_DONE"
    EPISODE_ID_IN_USE = "EPISODE_ID_IN_USE"
    UNKNOWN_PROBLEM = "UNKNOWN_PROBLEM"
    UNKNOWN_EPISODE = "UNKNOWN_EPISODE"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    TIMEOUT = "TIMEOUT"
    SHUTTING_DOWN = "SHUTTING_DOWN"


# --------------------------------------------------------------------------- domain types


class Message(BaseModel):
    """One chat message, ready for a chat template."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class Turn(BaseModel):
    """One debate turn in the transcript.

    ``t`` is the turn index (0-based): the action taken after observation ``t``.
    ``round`` is the solver/verifier round the turn belongs to (the judge's turn carries the
    last round's index).
    """

    model_config = ConfigDict(extra="forbid")
    t: int = Field(ge=0)
    role: Role
    round: int = Field(ge=0)
    content: str


class DebateAction(BaseModel):
    """An action: what the acting role says.

    ``metadata`` exists for OpenEnv compatibility (its ``Action`` base has it) and is ignored.
    Empty, over-long or wrong-role content validates here and is rejected by the environment
    with a typed error carrying an error kind (``empty_response``, ``too_long``,
    ``role_mismatch``).

    ``t`` (optional, RFC 0004 "Re-sent steps"): the turn this action is meant to take. Equal to
    the episode's next turn: acts as without it; a turn already taken with this same role and
    content: nothing is done again and the reply is the observation stored after that turn (a
    client whose reply was lost re-sends safely); anything else: ``OUT_OF_RANGE``.
    """

    model_config = ConfigDict(extra="forbid")
    role: Role
    content: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    t: int | None = Field(default=None, ge=0, description="the turn this action takes (re-sent steps, RFC 0004)")


class DebateObservation(BaseModel):
    """What the acting role sees (the OpenEnv ``Observation`` subclass for this environment).

    Attributes:
        episode_id: the episode this observation belongs to.
        problem_id: the problem (a MATH-500 ``unique_id``, ``gsm8k/<line>`` or
            ``gen/<family>/<seed>``), so an episode can be replayed with ``reset(problem_id=)``.
        problem: the problem statement.
        mode: ``debate`` (solver, verifier, judge) or ``single`` (one solver turn, no
            verifier or judge), chosen at reset (RFC 0006).
        role: the role that acts next; ``None`` once the debate is over.
        t: observation index = number of turns taken so far. ``state(t)`` replays it.
        round: current solver/verifier round (0-based).
        max_rounds: rounds allowed before the judge closes the debate (1 in ``single`` mode:
            the solver's one turn).
        messages: the chat the acting role must answer (empty when done).
        transcript: every turn so far, each with an explicit ``role``.
        done, reward, metadata: OpenEnv's fields. ``metadata`` holds the markers for the
            trainer, never shown to the policy (RFC 0002): ``episode_id``; ``turn`` and
            ``role`` of the turn the markers describe (``None`` on reset); the provisional
            ``error_kind`` / ``hint_template_key`` known without grading;
            ``circular_critique``: whether that turn sent the debate to the judge early by
            repeating a rejected answer or the previous review (RFC 0006); ``grading``:
            ``"none"``, ``"pending"`` or ``"graded"``.
    """

    model_config = ConfigDict(extra="forbid")
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    episode_id: str
    problem_id: str
    problem: str
    mode: EpisodeMode = EpisodeMode.DEBATE
    role: Role | None
    t: int = Field(ge=0)
    round: int = Field(ge=0)
    max_rounds: int = Field(ge=1)
    messages: list[Message]
    transcript: list[Turn]


class StepPayload(BaseModel):
    """The observation as it travels: OpenEnv's ``{observation, reward, done}`` plus metadata."""

    model_config = ConfigDict(extra="forbid")
    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)


class DebateState(BaseModel):
    """``state``: OpenEnv's ``episode_id`` and ``step_count`` plus this environment's fields."""

    model_config = ConfigDict(extra="allow")
    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)
    problem_id: str | None = None
    mode: EpisodeMode | None = None
    role: Role | None = None
    round: int = 0
    max_rounds: int | None = None
    done: bool = False
    graded: bool = False
    episode_reward: float | None = None


class ResetRequest(BaseModel):
    """``reset`` arguments. Unknown keys are ignored (OpenEnv drops extras it cannot route).

    Attributes:
        seed: picks the problem when ``problem_id`` is not given (same seed, same problem).
        episode_id: client-chosen id (<= 255 chars); must not be in use. Generated if absent.
        problem_id: replay a given problem (``unique_id`` from the problems file).
        max_rounds: per-episode override, 1..16 (ignored in ``single`` mode).
        mode: ``debate`` or ``single`` (RFC 0006); default: the server's ``--mode``. Any other
            value is a validation error.
    """

    model_config = ConfigDict(extra="allow")
    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, min_length=1, max_length=255)
    problem_id: str | None = Field(default=None, min_length=1, max_length=512)
    max_rounds: int | None = Field(default=None, ge=1, le=16)
    mode: EpisodeMode | None = None


# --------------------------------------------------------------------------- rewards


class TurnReward(BaseModel):
    """Graded reward of one turn.

    Attributes:
        t: turn index (matches ``Turn.t`` and the observation index ``state(t)`` replays).
        role: who acted.
        reward: solver: 1.0 if that turn's answer is correct; verifier: 1.0 if its verdict
            matches the true correctness of the answer it reviewed; judge: always 0.0.
        error_kind, hint_template_key: the final error-site marker of the turn.
        answer: the extracted final answer (solver and judge turns), else ``None``.
        correct: correctness of ``answer`` (solver/judge) or of the verdict (verifier).
        hint: a hint for this turn alone that says where its wrong answer goes wrong, for
            problem families that can (RFC 0002 "Localised hints"), else ``None``; a trainer
            uses it in place of the template of ``hint_template_key``.
    """

    model_config = ConfigDict(extra="forbid")
    t: int = Field(ge=0)
    role: Role
    reward: float
    error_kind: ErrorKind | None = None
    hint_template_key: str | None = None
    answer: str | None = None
    correct: bool | None = None
    hint: str | None = None


class CounterfactualFacts(BaseModel):
    """Episode facts that reward shaping needs (difference rewards, mixing, ...).

    Attributes:
        first_answer_correct: correctness of the solver's first answer, i.e. the outcome the
            debate would have had without the verifier.
        last_solver_answer_correct: correctness of the solver's last answer (the outcome
            without the judge, whose fallback is that answer).
        final_answer_correct: correctness of the final answer; equals ``episode_reward``.
        judge_correct: correctness of the judge's boxed answer; ``None`` if the judge gave none
            (and in ``single`` mode, which has no judge).
        verifier_accepted: whether the verifier accepted (the debate ended early); ``None`` in
            ``single`` mode (no verifier).
        rounds: solver/verifier rounds played (0 in ``single`` mode).
        local_rewards: per role, the mean of its per-turn rewards (judge: judge correctness as
            0/1, a metric only); the solver only in ``single`` mode.
        rewards_without_role: per role, the episode reward had that role been absent
            (``G_without_role`` of difference rewards): solver 0.0 (no answer at all),
            verifier ``first_answer_correct``, judge ``last_solver_answer_correct``; the
            solver only in ``single`` mode.
        circular_critique: whether the debate went to the judge early because the solver
            re-submitted a rejected answer or the verifier repeated its review (RFC 0006).
    """

    model_config = ConfigDict(extra="forbid")
    first_answer_correct: bool
    last_solver_answer_correct: bool
    final_answer_correct: bool
    judge_correct: bool | None
    verifier_accepted: bool | None
    rounds: int = Field(ge=0)
    local_rewards: dict[Role, float]
    rewards_without_role: dict[Role, float]
    circular_critique: bool = False


class EpisodeRewards(BaseModel):
    """The delayed-reward record, pushed once when an episode is graded (RFC 0003).

    The input of the trainer's role-mapped reward shaping. ``turns`` is ordered by ``t``.
    """

    model_config = ConfigDict(extra="forbid")
    episode_id: str
    session_id: str | None = None
    problem_id: str
    turns: list[TurnReward]
    episode_reward: float
    facts: CounterfactualFacts
    graded_at: float = Field(description="Unix time (s) when grading finished")
    mode: EpisodeMode = Field(default=EpisodeMode.DEBATE,
                              description="the episode's mode (RFC 0006); records written before it was named are debates")


class RewardsStatus(BaseModel):
    """Reply to a rewards request (and the shape of a pushed ``rewards`` frame's data)."""

    model_config = ConfigDict(extra="forbid")
    status: Literal["graded", "pending"]
    episode_id: str
    record: EpisodeRewards | None = None


# --------------------------------------------------------------------------- mux frames


RequestId = Annotated[str | Annotated[int, Field(ge=-(2**63), le=2**64 - 1)], Field(union_mode="left_to_right")]
"""A client's request id, echoed in the reply: a string, or an integer that fits 64 bits (what a
reply can carry back: orjson writes integers from -2**63 to 2**64 - 1)."""


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: RequestId


class _SessionFrame(_Frame):
    session_id: str = Field(min_length=1, max_length=128)


class AttachData(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resume_token: str = Field(min_length=1, max_length=256)


class StateQuery(BaseModel):
    """``state`` request: without ``t`` the current state; with ``t`` the replay of
    observation ``t`` of the current episode, or of ``episode_id`` (an earlier, retained
    episode of the same session)."""

    model_config = ConfigDict(extra="forbid")
    t: int | None = None
    episode_id: str | None = Field(default=None, min_length=1, max_length=255)


class RewardsQuery(BaseModel):
    """``rewards`` request: the record of ``episode_id`` (default: the session's latest
    episode). With ``wait`` the reply comes when grading finishes or after ``timeout_s``."""

    model_config = ConfigDict(extra="forbid")
    episode_id: str | None = Field(default=None, min_length=1, max_length=255)
    wait: bool = False
    timeout_s: float = Field(default=30.0, gt=0, le=600)


class ForkRequest(BaseModel):
    """``POST /episodes/{episode_id}/fork`` body (RFC 0007): start at observation ``t``;
    ``fork_episode_id``: the fork's own episode id (default: a new one)."""

    model_config = ConfigDict(extra="forbid")
    t: int
    fork_episode_id: str | None = Field(default=None, min_length=1, max_length=255)


class ForkQuery(ForkRequest):
    """``fork`` request on ``/ws/mux`` (RFC 0007): a new session whose episode starts at
    observation ``t`` of the session's current episode, or of ``episode_id`` (an earlier,
    retained episode of the same session)."""

    episode_id: str | None = Field(default=None, min_length=1, max_length=255)


class OpenData(BaseModel):
    """``open`` request. ``open_id``: a nonce the client chose (at least 16 characters, e.g.
    128 random bits in hex) that makes a re-sent ``open`` safe: while the session it opened
    lives, within ``resume_window_s`` of the first ``open``, the same ``open_id`` gets the same
    session and resume token (moved to the asking connection) instead of a second session
    (RFC 0001, "Re-sent opens"). Other keys are ignored, as before."""

    model_config = ConfigDict(extra="ignore")
    open_id: str | None = Field(default=None, min_length=16, max_length=128)


class OpenFrame(_Frame):
    type: Literal["open"]
    data: OpenData = Field(default_factory=OpenData)


class AttachFrame(_SessionFrame):
    type: Literal["attach"]
    data: AttachData


class ResetFrame(_SessionFrame):
    type: Literal["reset"]
    data: ResetRequest = Field(default_factory=ResetRequest)


class StepFrame(_SessionFrame):
    type: Literal["step"]
    data: DebateAction


class StateFrame(_SessionFrame):
    type: Literal["state"]
    data: StateQuery = Field(default_factory=StateQuery)


class ForkFrame(_SessionFrame):
    type: Literal["fork"]
    data: ForkQuery


class RewardsFrame(_SessionFrame):
    type: Literal["rewards"]
    data: RewardsQuery = Field(default_factory=RewardsQuery)


class CloseFrame(_SessionFrame):
    type: Literal["close"]
    data: dict[str, Any] = Field(default_factory=dict)


class PingFrame(_Frame):
    type: Literal["ping"]
    data: dict[str, Any] = Field(default_factory=dict)


ClientFrame = Annotated[
    OpenFrame | AttachFrame | ResetFrame | StepFrame | StateFrame | ForkFrame | RewardsFrame | CloseFrame | PingFrame,
    Field(discriminator="type"),
]
"""Every frame a client may send on ``/ws/mux`` (discriminated by ``type``)."""

CLIENT_FRAME_TYPES: tuple[str, ...] = tuple(
    get_args(frame.model_fields["type"].annotation)[0] for frame in get_args(get_args(ClientFrame)[0])
)
"""The ``type`` of every client frame on ``/ws/mux``, derived from :data:`ClientFrame`."""

ServerFrameType = Literal[
    "opened", "attached", "observation", "state", "replay", "forked", "rewards", "closed", "pong", "error",
    "session_closed"
]
"""The ``type`` of every frame the server sends on ``/ws/mux``: replies echo the request's
``request_id``; ``rewards`` and ``session_closed`` are also pushed with ``request_id: null``."""

SERVER_FRAME_TYPES: tuple[str, ...] = get_args(ServerFrameType)

MAX_BATCH_FRAMES = 1024
"""Most frames in one ``/ws/mux`` batch message (RFC 0005), either way."""

AUTH_TOKEN_ENV = "MATHDEBATE_AUTH_TOKEN"
"""The environment variable that holds the bearer token: the server requires it on every route
but ``/health`` when set, and the clients (``play``, the trainer, ``eval``) send it."""


# --------------------------------------------------------------------------- OpenEnv /ws frames


class WSResetMessage(BaseModel):
    """OpenEnv ``/ws`` reset: ``{"type": "reset", "data": {seed?, episode_id?, problem_id?, mode?, ...}}``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["reset"]
    data: dict[str, Any] = Field(default_factory=dict)


class WSStepMessage(BaseModel):
    """OpenEnv ``/ws`` step: ``{"type": "step", "data": <action>}`` (``data`` required)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["step"]
    data: dict[str, Any]


class WSStateMessage(BaseModel):
    """OpenEnv ``/ws`` state: ``{"type": "state"}``; the optional ``data: {"t": ...}`` is this
    server's ``state(t)`` extension (OpenEnv 0.3.0 itself rejects a ``data`` key)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["state"]
    data: StateQuery | None = None


class WSCloseMessage(BaseModel):
    """OpenEnv ``/ws`` close: ``{"type": "close"}``; no reply, the socket closes with 1000."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["close"]


class WSForkMessage(BaseModel):
    """This server's ``fork`` extension on ``/ws`` (RFC 0007): ``{"type": "fork", "data": {"t": ...}}``;
    the connection goes on in the fork (its reply is the fork's observation)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["fork"]
    data: ForkQuery


OPENENV_MESSAGES: dict[str, type[BaseModel]] = {
    "reset": WSResetMessage, "step": WSStepMessage, "state": WSStateMessage, "close": WSCloseMessage,
    "fork": WSForkMessage,
}
