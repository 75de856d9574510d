"""Client-side placement of sessions over several env server replicas.

One process keeps one multiplexed connection (:class:`~env_server.client.MuxClient`) per
replica and places each new session on the **least-loaded healthy replica**: the one with the
fewest sessions from this process (open, or opening: awaiting the server's reply), ties to the
earliest in the list. A replica is healthy unless its connection is down (the client is
reconnecting) or its last connection attempt failed less than ``retry_down_s`` ago. So a
replica that goes down gets no new sessions; its open sessions wait for it (the client
reconnects on its own, up to ``reconnect_budget_s``) and resume when it comes back with
``--state-dir``; past that budget their calls raise ``ConnectionError`` (or
:class:`~env_server.client.SessionLostError` when it came back without its state), and a caller
that must finish the episode re-runs it on another replica on the same ``problem_id`` (the
trainer's environment does: ``trainer_client.rollout.environment``).

Least-loaded placement needs no coordination between processes and spreads each process's
sessions evenly; a replica added later fills up as sessions turn over. Consistent hashing would
keep a session on one replica across processes, which nothing here needs (a session lives on
the connection that opened it). A load balancer in front of the replicas is the alternative
(README, "Scaling out").

Usage::

    async with ReplicaPool("http://a:8000,http://b:8000") as pool:
        session = await pool.open_session()      # a MuxSession on the least-loaded replica
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Literal

import websockets

from env_server.client import (
    DEFAULT_RECONNECT_BUDGET_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    LoopThread,
    MuxClient,
    MuxSession,
    SyncMuxSession,
)

__all__ = ["NoReplicaError", "ReplicaPool", "SyncReplicaPool", "parse_urls"]


class NoReplicaError(ConnectionError):
    """No replica accepted a new session (all down or refusing)."""


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """Base URLs from a list or a comma-separated string (blanks dropped, order kept).

    Raises:
        ValueError: no URL.
    """
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    parsed = [u.strip() for u in items if u and u.strip()]
    if not parsed:
        raise ValueError(f"no env server URL in {urls!r}")
    return parsed


class ReplicaPool:
    """Sessions placed over several replicas (module docstring: policy).

    Args:
        urls: base URLs, a list or a comma-separated string.
        token: bearer token for every replica.
        request_timeout_s, batch, reconnect_budget_s, compression: for each replica's ``MuxClient``.
        retry_down_s: how long a replica whose connection attempt failed gets no new sessions.

    Attributes:
        clients: one ``MuxClient`` per replica, in ``urls`` order.
        reruns: episodes re-run on another replica (counted by the callers that re-run them:
            :meth:`count_rerun`).
    """

    def __init__(self, urls: str | Sequence[str], token: str | None = None,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, batch: bool = True,
                 reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S, retry_down_s: float = 5.0,
                 compression: Literal["deflate"] | None = None) -> None:
        self.urls = parse_urls(urls)
        self.clients = [MuxClient(url, token, request_timeout_s, batch=batch, reconnect_budget_s=reconnect_budget_s,
                                  compression=compression) for url in self.urls]
        self.retry_down_s = retry_down_s
        self.reruns = 0
        self._down_until = [0.0] * len(self.clients)
        #: opens sent to each replica and not yet answered: they count as load, so that many
        #: concurrent first opens spread over the replicas instead of all seeing the same
        #: loads and herding onto the first least-loaded one
        self._opening = [0] * len(self.clients)

    async def __aenter__(self) -> ReplicaPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def load(self) -> list[int]:
        """Sessions per replica (this process's: open, or being opened), in ``urls`` order."""
        return [sum(1 for s in client.sessions if s.lost is None) + opening
                for client, opening in zip(self.clients, self._opening, strict=True)]

    def healthy(self) -> list[bool]:
        """Whether each replica may take new sessions now."""
        now = time.monotonic()
        return [now >= down and not client.reconnecting for client, down in zip(self.clients, self._down_until,
                                                                                 strict=True)]

    def replica_of(self, session: MuxSession) -> str:
        """The base URL of the replica holding ``session``."""
        return next(url for url, client in zip(self.urls, self.clients, strict=True) if client is session.client)

    async def open_session(self) -> MuxSession:
        """Open a session on the least-loaded healthy replica; a replica that fails to
        connect or refuses (capacity) is skipped and the next one tried.

        Raises:
            NoReplicaError: every replica failed (the last error is chained).
        """
        load, healthy = self.load(), self.healthy()
        order = sorted(range(len(self.clients)), key=lambda i: (not healthy[i], load[i], i))
        last: BaseException | None = None
        for i in order:
            self._opening[i] += 1
            try:
                return await self.clients[i].open_session()
            except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
                self._down_until[i] = time.monotonic() + self.retry_down_s
                last = exc
            except Exception as exc:  # a refusal (e.g. CAPACITY_REACHED): try the next replica
                last = exc
            finally:
                self._opening[i] -= 1
        raise NoReplicaError(f"no env replica accepted a session ({', '.join(self.urls)}): {last}") from last

    def count_rerun(self) -> None:
        """Count one episode re-run on another replica."""
        self.reruns += 1

    async def close(self) -> None:
        """Close every connection (sessions stay on their replicas for the resume window)."""
        await asyncio.gather(*(client.close() for client in self.clients), return_exceptions=True)


class SyncReplicaPool:
    """Blocking facade of :class:`ReplicaPool` (one event-loop thread for every replica),
    for synchronous code such as TRL's environments. Thread-safe."""

    def __init__(self, urls: str | Sequence[str], token: str | None = None,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, batch: bool = True,
                 reconnect_budget_s: float = DEFAULT_RECONNECT_BUDGET_S, retry_down_s: float = 5.0,
                 compression: Literal["deflate"] | None = None) -> None:
        self._runner = LoopThread()
        self.pool = ReplicaPool(urls, token, request_timeout_s, batch, reconnect_budget_s, retry_down_s, compression)

    @property
    def urls(self) -> list[str]:
        return self.pool.urls

    @property
    def reruns(self) -> int:
        """Episodes re-run on another replica."""
        return self.pool.reruns

    def count_rerun(self) -> None:
        """Count one episode re-run on another replica."""
        self.pool.count_rerun()

    def open_session(self) -> SyncMuxSession:
        """:meth:`ReplicaPool.open_session`, blocking."""
        return SyncMuxSession(self._runner.run(self.pool.open_session()), self._runner)

    def replica_of(self, session: SyncMuxSession) -> str:
        """The base URL of the replica holding ``session``."""
        return self.pool.replica_of(session.session)

    def load(self) -> list[int]:
        """Open sessions per replica."""
        return self.pool.load()

    def close(self) -> None:
        try:
            self._runner.run(self.pool.close())
        finally:
            self._runner.stop()
