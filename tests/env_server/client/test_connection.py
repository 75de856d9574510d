"""The blocking client, and the trajectory log written on a graceful shutdown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from env_server.cli import running_server
from env_server.client import MuxError, SyncMuxClient
from env_server.debate.problems import ProblemGenerator

GENERATOR = ProblemGenerator()


def test_sync_client_plays_and_every_graded_episode_is_logged_once(tmp_path: Path) -> None:
    log = tmp_path / "trajectories.jsonl"
    played = []
    with running_server(["--trajectory-log", str(log), "--grading-workers", "1"]) as url, SyncMuxClient(url) as client:
        session = client.open_session()
        for seed in range(12):
            problem = GENERATOR.by_seed(seed)
            result = session.reset(problem_id=problem.problem_id)
            answer = problem.answer if seed % 3 else "-999999"
            session.step("solver", rf"\boxed{{{answer}}}")
            session.step("verifier", "VERDICT: CORRECT")
            result = session.step("judge", rf"\boxed{{{answer}}}")
            assert result.done
            played.append((result.observation.episode_id, 1.0 if seed % 3 else 0.0))
        try:
            session.step("judge", "again")
        except MuxError as exc:
            assert exc.code == "EPISODE_DONE"
        else:
            raise AssertionError("a step after the end must fail")
        assert session.rewards().episode_reward == played[-1][1]
        assert client.ping() > 0
        # leaving the block sends SIGTERM: in-flight grading finishes within the grace period
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((line["episode_id"], line["rewards"]["episode_reward"]) for line in lines) == sorted(played)
    assert all(len(line["turns"]) == 3 and line["turns"][0]["role"] == "solver" for line in lines)


def test_connection_state_follows_connect_drop_reconnect_and_close(server_url: str) -> None:
    """``MuxClient.state``: disconnected -> connected -> reconnecting (a dropped transport)
    -> connected again with the session re-attached -> disconnected after ``close``."""
    import asyncio

    from env_server.client import ConnectionState, MuxClient

    async def scenario() -> list[ConnectionState]:
        client = MuxClient(server_url, reconnect_budget_s=20)
        seen = [client.state]
        await client.connect()
        seen.append(client.state)
        session = await client.open_session()
        await session.reset(seed=1)
        gate, open_socket = asyncio.Event(), client._open_socket

        async def held_open() -> None:  # the reconnect waits until the test has looked
            await gate.wait()
            await open_socket()

        client._open_socket = held_open  # type: ignore[method-assign]  # hold the reconnect at its first attempt
        await client.drop(reconnect=True)
        for _ in range(2000):  # the read loop notices the aborted transport
            if client.state is ConnectionState.RECONNECTING:
                break
            await asyncio.sleep(0.005)
        seen.append(client.state)
        gate.set()
        state = await session.state()  # waits for the reconnect, then answers on the new connection
        assert state["episode_id"] == session.episode_id
        seen.append(client.state)
        assert client.reconnects == 1 and client.connected
        await client.close()
        seen.append(client.state)
        return seen

    assert asyncio.run(scenario()) == [ConnectionState.DISCONNECTED, ConnectionState.CONNECTED,
                                       ConnectionState.RECONNECTING, ConnectionState.CONNECTED,
                                       ConnectionState.DISCONNECTED]


def test_mux_client_compresses_only_when_asked(server_url) -> None:
    """``MuxClient`` negotiates no permessage-deflate by default (it cost the server about 1.6x its
    CPU per step; benchmarks/README.md) and asks for it with ``compression="deflate"``; both play."""
    from env_server.client import MuxClient

    async def main() -> None:
        async with MuxClient(server_url) as plain, MuxClient(server_url, compression="deflate") as deflated:
            assert plain._ws.protocol.extensions == []
            assert [type(e).__name__ for e in deflated._ws.protocol.extensions] == ["PerMessageDeflate"]
            for client in (plain, deflated):
                session = await client.open_session()
                problem = GENERATOR.by_seed(5)
                await session.reset(problem_id=problem.problem_id)
                result = await session.step("solver", rf"\boxed{{{problem.answer}}}")
                assert result.observation.role == "verifier"

    asyncio.run(main())


def test_sync_clients_pass_compression_on(server_url) -> None:
    """``SyncMuxClient`` and ``SyncReplicaPool`` (the trainer's) negotiate no compression by default
    and pass ``compression="deflate"`` on to their connections."""
    from env_server.client import SyncMuxClient
    from env_server.client.replicas import SyncReplicaPool

    def extensions(client: Any) -> list[str]:
        return [type(e).__name__ for e in client._ws.protocol.extensions]

    for compression, expected in ((None, []), ("deflate", ["PerMessageDeflate"])):
        with SyncMuxClient(server_url, compression=compression) as sync_client:
            sync_client.open_session()
            assert extensions(sync_client._client) == expected
        pool = SyncReplicaPool(server_url, compression=compression)
        try:
            session = pool.open_session()
            problem = GENERATOR.by_seed(6)
            session.reset(problem_id=problem.problem_id)
            assert extensions(pool.pool.clients[0]) == expected
        finally:
            pool.close()
