"""Limits and isolation on a real server: capacity, idle reaping, resume windows, auth."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets

from env_server.cli import running_server
from env_server.client import MuxClient, MuxError


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def small_server():
    with running_server(["--max-sessions", "5", "--max-sessions-per-connection", "3", "--resume-window", "1",
                         "--idle-timeout", "3", "--reap-interval", "0.2", "--grading-workers", "1"]) as url:
        yield url


def test_per_connection_and_server_limits_give_clear_errors(small_server) -> None:
    async def main() -> None:
        async with MuxClient(small_server) as a, MuxClient(small_server) as b:
            for _ in range(3):
                await a.open_session()
            with pytest.raises(MuxError) as info:
                await a.open_session()
            assert info.value.code == "CAPACITY_REACHED" and info.value.data["scope"] == "connection"
            await b.open_session()
            await b.open_session()
            with pytest.raises(MuxError) as info:
                await b.open_session()
            assert info.value.code == "CAPACITY_REACHED" and info.value.data["scope"] == "server"
            assert info.value.data["max_sessions"] == 5
            # OpenEnv /ws at capacity: an error frame, then a normal close (never a silent close)
            async with websockets.connect(small_server.replace("http", "ws") + "/ws") as ws:
                reply = json.loads(await ws.recv())
                assert reply["data"]["code"] == "CAPACITY_REACHED"
                assert reply["data"]["active_sessions"] == 5
            # HTTP too
            async with httpx.AsyncClient(base_url=small_server) as http:
                response = await http.post("/reset", json={})
                assert response.status_code == 503 and response.json()["detail"]["code"] == "CAPACITY_REACHED"
            # the existing sessions still work
            session = a.sessions[0]
            assert (await session.reset(seed=1)).observation.t == 0
            # closing frees a slot
            await a.sessions[1].close()
            await b.open_session()
            for opened in a.sessions + b.sessions:  # leave no detached sessions behind
                await opened.close()

    run(main())


def test_idle_sessions_are_reaped_with_a_push(small_server) -> None:
    async def main() -> None:
        async with MuxClient(small_server) as client:
            session = await client.open_session()
            await session.reset(seed=2)
            deadline = time.monotonic() + 10
            while session.closed_reason is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert session.closed_reason == "idle_timeout"
            with pytest.raises(MuxError) as info:
                await session.state()
            assert info.value.code == "UNKNOWN_SESSION"

    run(main())


def test_resume_window_expires(small_server) -> None:
    async def main() -> None:
        client = await MuxClient(small_server).connect()
        session = await client.open_session()
        await client.drop()
        await asyncio.sleep(2.0)  # window is 1 s
        await client.connect()
        with pytest.raises(MuxError) as info:
            await client.attach(session.session_id, session.resume_token)
        assert info.value.code == "UNKNOWN_SESSION"
        await client.close()

    run(main())


def test_bearer_token_is_enforced_when_set() -> None:
    with running_server(["--grading-workers", "1"], env={"MATHDEBATE_AUTH_TOKEN": "s3cret"}) as url:
        with httpx.Client(base_url=url) as http:
            assert http.get("/health").status_code == 200  # open for load balancers
            assert http.get("/metadata").status_code == 401
            assert http.post("/reset", json={}).status_code == 401
            assert http.get("/metadata", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert http.get("/metadata", headers={"Authorization": "Bearer s3cret"}).status_code == 200

        async def main() -> None:
            async with websockets.connect(url.replace("http", "ws") + "/ws/mux") as ws:
                reply = json.loads(await ws.recv())
                assert reply["data"]["code"] == "UNAUTHORIZED"
            async with MuxClient(url, token="s3cret") as client:
                session = await client.open_session()
                assert (await session.reset(seed=1)).observation.role == "solver"

        run(main())
