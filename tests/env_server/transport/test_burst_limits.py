"""Limits under a burst of 20,000 session-open requests: per-connection and server-wide caps hold
exactly, refusals are typed, the server stays responsive and capacity comes back."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import websockets
from reliability_helpers import RawMux, play_reference_episode

from env_server.cli import running_server

CONNECTIONS, OPENS_PER_CONNECTION = 4, 5000
MAX_SESSIONS, PER_CONNECTION = 5000, 2000


async def burst(url: str) -> list[dict[str, int]]:
    async def one_connection() -> dict[str, int]:
        counts = {"opened": 0, "connection": 0, "server": 0, "other": 0}
        async with websockets.connect(url.replace("http", "ws") + "/ws/mux", max_size=None,
                                      open_timeout=60) as ws:
            frames = [json.dumps({"type": "open", "request_id": i}) for i in range(OPENS_PER_CONNECTION)]
            for frame in frames:  # pipelined: no waiting for replies
                await ws.send(frame)
            for _ in frames:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if reply["type"] == "opened":
                    counts["opened"] += 1
                elif reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED":
                    counts[reply["data"]["scope"]] += 1
                else:
                    counts["other"] += 1
        return counts

    return await asyncio.gather(*(one_connection() for _ in range(CONNECTIONS)))


def test_twenty_thousand_opens_hold_every_limit() -> None:
    args = ["--max-sessions", str(MAX_SESSIONS), "--max-sessions-per-connection", str(PER_CONNECTION),
            "--resume-window", "1", "--reap-interval", "0.2", "--grading-workers", "1"]
    with running_server(args) as url:
        results = asyncio.run(burst(url))
        assert all(r["other"] == 0 for r in results), results
        assert all(r["opened"] <= PER_CONNECTION for r in results), results
        assert sum(r["opened"] for r in results) == MAX_SESSIONS  # exactly full, never over
        assert sum(r["opened"] + r["connection"] + r["server"] for r in results) == CONNECTIONS * OPENS_PER_CONNECTION
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        # the burst connections are gone: their sessions expire after the resume window
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/stats", timeout=10).json()["sessions"] > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert httpx.get(f"{url}/stats", timeout=10).json()["sessions"] == 0  # capacity released
        mux = RawMux(url)
        assert play_reference_episode(mux, 9)["episode_reward"] == 1.0
        mux.close()
