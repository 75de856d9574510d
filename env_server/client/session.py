"""A session on a ``/ws/mux`` connection (:class:`MuxSession`), what its calls return
(:class:`StepResult`), the errors they raise and the clients' default timeouts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from env_server.protocol.markers import EpisodeMode, Role
from env_server.protocol.models import DebateObservation, EpisodeRewards

__all__ = ["DEFAULT_RECONNECT_BUDGET_S", "DEFAULT_REQUEST_TIMEOUT_S", "DEFAULT_REWARDS_TIMEOUT_S", "GRADED_EPISODE_WAIT_S",
           "MuxError", "MuxSession", "SessionLostError", "SessionTransport", "StepResult", "payload_bytes"]


DEFAULT_RECONNECT_BUDGET_S = 120.0
"""How long a client keeps trying to reconnect after losing its connection, seconds."""

DEFAULT_REQUEST_TIMEOUT_S = 120.0
"""How long a request waits for its reply before ``TimeoutError``, seconds."""
DEFAULT_REWARDS_TIMEOUT_S = 60.0
"""How long ``rewards(wait=True)`` waits for grading before answering ``None``, seconds."""
GRADED_EPISODE_WAIT_S = 120.0
"""How long a player that needs every record (the scripted player, the trainer's environment)
waits for an episode's grading before giving up on it, seconds."""


class MuxError(Exception):
    """An error frame from the server.

    Attributes:
        code: the error code (e.g. ``INVALID_ACTION``).
        data: the whole ``data`` of the error frame (``error_kind`` etc.).
    """

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(f"{data.get('code')}: {data.get('message')}")
        self.code: str = data.get("code", "")
        self.data = data


class SessionLostError(MuxError):
    """The session is gone from the server (it restarted without ``--state-dir``, or the
    session outlived its resume window): open a new one. ``code`` is the refusal of the
    re-attachment (``UNKNOWN_SESSION`` or ``RESUME_DENIED``)."""


@dataclass
class StepResult:
    """An observation as returned by ``reset``/``step``.

    Attributes:
        observation: the parsed observation.
        reward: the reward on the wire (``None`` on ``/ws/mux``: rewards are delayed).
        done: whether the debate is over.
        metadata: the markers (``error_kind``, ``hint_template_key``, ...).
        raw: the payload exactly as received (bytes), e.g. to compare with ``state(t)``.
    """

    observation: DebateObservation
    reward: float | None
    done: bool
    metadata: dict[str, Any]
    raw: bytes = field(repr=False, default=b"")

    @classmethod
    def from_payload(cls, payload: dict[str, Any], raw: bytes = b"") -> StepResult:
        obs = DebateObservation.model_validate(
            {**payload["observation"], "reward": payload.get("reward"), "done": payload.get("done", False),
             "metadata": payload.get("metadata", {})}
        )
        return cls(obs, payload.get("reward"), payload.get("done", False), payload.get("metadata", {}), raw)


def payload_bytes(frame_text: str | bytes) -> bytes:
    """The raw bytes of a frame's ``data`` value (frames end with ``"data":<payload>}``)."""
    raw = frame_text.encode() if isinstance(frame_text, str) else frame_text
    start = raw.index(b'"data":') + len(b'"data":')
    return raw[start:-1]


class SessionTransport(Protocol):
    """What a :class:`MuxSession` uses of its connection (``MuxClient``'s public members)."""

    reconnect_enabled: bool

    @property
    def reconnecting(self) -> bool: ...

    async def request(self, frame: dict[str, Any], resend: bool = True,
                      wait: bool = True) -> tuple[dict[str, Any], bytes]: ...

    def forget_session(self, session_id: str) -> None: ...

    def adopt_session(self, session: MuxSession) -> None: ...


class MuxSession:
    """A session on a ``MuxClient`` (any :class:`SessionTransport`). Create with ``client.open_session()``."""

    def __init__(self, client: SessionTransport, session_id: str, resume_token: str) -> None:
        self.client = client
        self.session_id = session_id
        self.resume_token = resume_token
        self.episode_id: str | None = None
        self.closed_reason: str | None = None
        #: the turn the next step takes (the last observation's ``t``); sent with every step
        self.next_t = 0
        #: set when the session is gone from the server (:class:`SessionLostError`)
        self.lost: SessionLostError | None = None
        self._records: dict[str, EpisodeRewards] = {}

    async def _call(self, type_: str, data: dict[str, Any] | None = None) -> tuple[dict[str, Any], bytes]:
        if self.lost is not None:
            raise self.lost
        try:
            return await self.client.request({"type": type_, "session_id": self.session_id, "data": data or {}})
        except MuxError as exc:
            lost = self._lost_error()  # (a method: set by the reconnect while this request waited)
            if lost is not None and exc.code == "UNKNOWN_SESSION":
                raise lost from None
            raise

    def _lost_error(self) -> SessionLostError | None:
        return self.lost

    async def reset(self, seed: int | None = None, episode_id: str | None = None, problem_id: str | None = None,
                    max_rounds: int | None = None, mode: EpisodeMode | str | None = None) -> StepResult:
        """Start an episode (see ``ResetRequest``); ``None`` arguments are left to the server.

        Args:
            seed, episode_id, problem_id, max_rounds: as ``ResetRequest``.
            mode: ``"debate"`` or ``"single"`` (RFC 0006); default: the server's ``--mode``.

        With the client's ``reconnect`` on and no ``episode_id`` given, the client picks one
        (128 random bits), so a reset re-sent after a lost connection is recognised.

        Raises:
            MuxError: the server refused (``VALIDATION_ERROR`` for an unknown mode or an
                out-of-range value, ``UNKNOWN_PROBLEM``, ``EPISODE_ID_IN_USE``, ...).
            SessionLostError: the session is gone from the server.
        """
        if isinstance(mode, EpisodeMode):
            mode = mode.value
        chosen = episode_id is None and self.client.reconnect_enabled
        if chosen:
            episode_id = os.urandom(16).hex()
        data = {k: v for k, v in {"seed": seed, "episode_id": episode_id, "problem_id": problem_id,
                                  "max_rounds": max_rounds, "mode": mode}.items() if v is not None}
        try:
            frame, raw = await self._call("reset", data)
            result = StepResult.from_payload(frame["data"], payload_bytes(raw))
        except MuxError as exc:
            if not (chosen and exc.code == "EPISODE_ID_IN_USE"):
                raise
            # our own id: the reset was re-sent after a lost reply and had already happened
            first = await self.state(t=0, episode_id=episode_id)
            result = StepResult.from_payload(orjson.loads(first["observation_raw"]), first["observation_raw"])
        self.episode_id = result.observation.episode_id
        self.next_t = result.observation.t
        return result

    async def step(self, role: Role | str, content: str, t: int | None = None) -> StepResult:
        """Act as ``role``. Raises :class:`MuxError` (``INVALID_ACTION`` with ``error_kind``)
        when the action is rejected; the episode is then unchanged.

        ``t`` (RFC 0004 "Re-sent steps"): the turn this action takes; default: the turn after
        the last observation this session received (``next_t``). A step re-sent with the ``t``
        of a turn already taken (same role and content) answers with the stored reply and
        acts no second time; another ``t`` raises ``OUT_OF_RANGE``. Raises
        :class:`SessionLostError` when the session is gone from the server."""
        data: dict[str, Any] = {"role": Role(role).value, "content": content,
                                "t": self.next_t if t is None else t}
        frame, raw = await self._call("step", data)
        result = StepResult.from_payload(frame["data"], payload_bytes(raw))
        self.next_t = max(self.next_t, result.observation.t)
        return result

    async def fork(self, t: int, episode_id: str | None = None,
                   fork_episode_id: str | None = None) -> tuple[MuxSession, StepResult]:
        """A new session whose episode starts at observation ``t`` of this session's current
        episode (or of ``episode_id``, an earlier retained one), RFC 0007. This session is not
        touched; the fork is owned by this connection (re-attached after a reconnect like any
        session) and is closed with its own :meth:`close`.

        Returns:
            ``(fork, result)``: the fork's session and its first observation (``state(t)`` of
            the original but for ``episode_id``), with ``fork.next_t == t``.

        Raises:
            MuxError: ``UNKNOWN_EPISODE``, ``OUT_OF_RANGE`` (``t`` past the episode),
                ``CAPACITY_REACHED``; nothing is created then.
            SessionLostError: this session is gone from the server.
        """
        data = {k: v for k, v in {"t": t, "episode_id": episode_id, "fork_episode_id": fork_episode_id}.items()
                if v is not None}
        frame, raw = await self._call("fork", data)
        payload = payload_bytes(raw)
        start = payload.index(b'"observation":') + len(b'"observation":')
        result = StepResult.from_payload(frame["data"]["observation"], payload[start:-1])
        fork = MuxSession(self.client, frame["data"]["session_id"], frame["data"]["resume_token"])
        fork.episode_id, fork.next_t = result.observation.episode_id, result.observation.t
        self.client.adopt_session(fork)
        return fork, result

    async def state(self, t: int | None = None, episode_id: str | None = None) -> dict[str, Any]:
        """The current state, or with ``t`` ``{"t", "episode_id", "observation"}`` where
        ``observation`` is observation ``t`` exactly as sent (``observation_raw`` holds its
        bytes)."""
        data = {k: v for k, v in {"t": t, "episode_id": episode_id}.items() if v is not None}
        frame, raw = await self._call("state", data)
        out: dict[str, Any] = frame["data"]
        if t is not None:
            payload = payload_bytes(raw)
            start = payload.index(b'"observation":') + len(b'"observation":')
            out["observation_raw"] = payload[start:-1]
        return out

    async def rewards(self, episode_id: str | None = None, wait: bool = True,
                      timeout_s: float = DEFAULT_REWARDS_TIMEOUT_S) -> EpisodeRewards | None:
        """The delayed-reward record of ``episode_id`` (default: the latest episode); with
        ``wait`` it blocks until grading finishes or ``timeout_s`` passes (then ``None``)."""
        episode_id = episode_id or self.episode_id
        if episode_id in self._records:
            return self._records[episode_id]
        data: dict[str, Any] = {"wait": wait, "timeout_s": timeout_s}
        if episode_id is not None:
            data["episode_id"] = episode_id
        frame, _ = await self._call("rewards", data)
        self._on_rewards(frame["data"])
        return self._records.get(frame["data"]["episode_id"])

    async def close(self) -> None:
        """Close the session on the server (a session already gone counts as closed)."""
        try:
            await self._call("close")
        except MuxError as exc:
            if exc.code != "UNKNOWN_SESSION" and not isinstance(exc, SessionLostError):
                raise
        self.client.forget_session(self.session_id)

    def _on_rewards(self, data: dict[str, Any]) -> None:
        if data.get("status") == "graded" and data.get("record"):
            record = EpisodeRewards.model_validate(data["record"])
            self._records[record.episode_id] = record
