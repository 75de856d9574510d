"""Blocking facades of the ``/ws/mux`` client: :class:`SyncMuxClient` and :class:`SyncMuxSession`,
run on an event loop in a daemon thread (:class:`LoopThread`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from env_server.client.connection import MuxClient
from env_server.client.session import (
    DEFAULT_RECONNECT_BUDGET_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_REWARDS_TIMEOUT_S,
    MuxSession,
    StepResult,
)
from env_server.protocol.markers import EpisodeMode, Role
from env_server.protocol.models import EpisodeRewards

__all__ = ["LoopThread", "SyncMuxClient", "SyncMuxSession"]

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` runs a coroutine on it and
    blocks for the result (the synchronous facades' engine).

    Written here rather than anyio's blocking portal (``anyio.from_thread.start_blocking_portal``):
    the portal's thread is not a daemon, so a client nobody closes (TRL never closes the
    environments it builds) would keep the interpreter from exiting."""

    def __init__(self, name: str = "mathdebate-client") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; its future, without waiting."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and block for its result.

        Raises:
            TimeoutError: no result within ``timeout_s`` seconds (``None``: wait as long as it takes).
        """
        return self.submit(coro).result(timeout_s)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop's thread."""
        self.loop.call_soon_threadsafe(callback)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout_s)


class SyncMuxSession:
    """Blocking facade of :class:`MuxSession` (same methods, no ``await``)."""

    def __init__(self, session: MuxSession, runner: LoopThread) -> None:
        self._session = session
        self._runner = runner

    @property
    def session(self) -> MuxSession:
        """The asynchronous session behind this facade."""
        return self._session

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def episode_id(self) -> str | None:
        return self._session.episode_id

    def reset(self, seed: int | None = None, episode_id: str | None = None, problem_id: str | None = None,
              max_rounds: int | None = None, mode: EpisodeMode | str | None = None) -> StepResult:
        """:meth:`MuxSession.reset`, blocking (same arguments, same :class:`MuxError`)."""
        return self._runner.run(self._session.reset(seed, episode_id, problem_id, max_rounds, mode))

    def step(self, role: Role | str, content: str, t: int | None = None) -> StepResult:
        """:meth:`MuxSession.step`, blocking (same arguments, same :class:`MuxError`)."""
        return self._runner.run(self._session.step(role, content, t))

    def state(self, t: int | None = None, episode_id: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._session.state(t, episode_id))

    def fork(self, t: int, episode_id: str | None = None,
             fork_episode_id: str | None = None) -> tuple[SyncMuxSession, StepResult]:
        """:meth:`MuxSession.fork`, blocking: ``(the fork's session, its first observation)``."""
        fork, result = self._runner.run(self._session.fork(t, episode_id, fork_episode_id))
        return SyncMuxSession(fork, self._runner), result

    def rewards(self, episode_id: str | None = None, wait: bool = True,
                timeout_s: float = DEFAULT_REWARDS_TIMEOUT_S) -> EpisodeRewards | None:
        return self._runner.run(self._session.rewards(episode_id, wait, timeout_s))

    def close(self) -> None:
        self._runner.run(self._session.close())


class SyncMuxClient:
    """Blocking facade of :class:`MuxClient`, for scripts and for trainers with synchronous
    environment code (TRL calls environment methods synchronously). Thread-safe: calls from
    several threads share the one connection. Arguments as :class:`MuxClient`'s."""

    def __init__(self, base_url: str, token: str | None = None, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 batch: bool = True, reconnect: bool = True,
                 reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S,
                 compression: Literal["deflate"] | None = None) -> None:
        self._runner = LoopThread()
        self._client = MuxClient(base_url, token, request_timeout_s, batch=batch, reconnect=reconnect,
                                 reconnect_budget_s=reconnect_budget_s, compression=compression)
        self._runner.run(self._client.connect())

    def open_session(self) -> SyncMuxSession:
        return SyncMuxSession(self._runner.run(self._client.open_session()), self._runner)

    def reconnect(self) -> None:
        self._runner.run(self._client.reconnect())

    def ping(self) -> float:
        return self._runner.run(self._client.ping())

    def close(self) -> None:
        try:
            self._runner.run(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncMuxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
