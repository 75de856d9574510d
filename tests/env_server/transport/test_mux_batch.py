"""Frame batching on /ws/mux (RFC 0005) against a real server on a real socket."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from env_server.client import MuxClient
from env_server.debate.problems import ProblemGenerator
from env_server.protocol.models import MAX_BATCH_FRAMES

GENERATOR = ProblemGenerator()


def run(coro):
    return asyncio.run(coro)


def ws_url(server_url: str, query: str = "") -> str:
    return server_url.replace("http", "ws") + "/ws/mux" + query


async def recv_frames(ws, count: int, timeout: float = 30) -> list[dict]:
    """Read messages until ``count`` frames arrived; each message must be an array."""
    frames: list[dict] = []
    while len(frames) < count:
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        assert isinstance(message, list) and message, message
        frames.extend(message)
    assert len(frames) == count
    return frames


def test_client_batches_more_requests_than_one_batch_holds(server_url) -> None:
    """1,500 sessions opened and played in lockstep by one batching client: every batch it
    sends stays within the server's frame limit and every request gets its own reply."""
    async def main() -> None:
        async with MuxClient(server_url) as client:
            assert client.batch
            sessions = await asyncio.gather(*(client.open_session() for _ in range(MAX_BATCH_FRAMES + 476)))
            assert len({s.session_id for s in sessions}) == len(sessions)
            problem = GENERATOR.by_seed(8)
            await asyncio.gather(*(s.reset(problem_id=problem.problem_id) for s in sessions))
            for role, text in (("solver", problem.solution), ("verifier", "VERDICT: CORRECT"),
                               ("judge", rf"\boxed{{{problem.answer}}}")):
                results = await asyncio.gather(*(s.step(role, text) for s in sessions))
            assert all(r.done for r in results)
            records = await asyncio.gather(*(s.rewards() for s in sessions))
            assert {r.episode_reward for r in records} == {1.0}
            await asyncio.gather(*(s.close() for s in sessions))

    run(main())


def test_batched_and_unbatched_clients_see_the_same_debate(server_url) -> None:
    async def play(batch: bool) -> tuple[list[bytes], dict]:
        async with MuxClient(server_url, batch=batch) as client:
            session = await client.open_session()
            problem = GENERATOR.by_seed(31)
            raws = [(await session.reset(problem_id=problem.problem_id, episode_id=f"batch-{batch}")).raw]
            # (a wrong first answer: the answer is 0, and re-submitting a rejected answer would go
            # straight to the judge, RFC 0006)
            for role, text in (("solver", r"\boxed{-987654}"), ("verifier", "VERDICT: INCORRECT"),
                               ("solver", problem.solution), ("verifier", "VERDICT: CORRECT"),
                               ("judge", rf"\boxed{{{problem.answer}}}")):
                raws.append((await session.step(role, text)).raw)
            replays = [(await session.state(t=t))["observation_raw"] for t in range(len(raws) - 1)]
            assert replays == raws[:-1]  # state(t) byte for byte, also through a batch reply
            record = (await session.rewards()).model_dump(mode="json")
            return raws, record

    batched, batched_record = run(play(True))
    plain, plain_record = run(play(False))
    assert [r.replace(b"batch-True", b"batch-False") for r in batched] == plain
    for record in (batched_record, plain_record):
        record.pop("episode_id"), record.pop("session_id"), record.pop("graded_at")
    assert batched_record == plain_record


def test_over_long_batch_is_refused_frame_by_frame_and_nothing_runs(server_url) -> None:
    async def main() -> None:
        before = httpx.get(server_url + "/stats").json()["sessions"]
        async with websockets.connect(ws_url(server_url, "?batch=1"), max_size=None) as ws:
            count = MAX_BATCH_FRAMES + 1
            await ws.send(json.dumps([{"type": "open", "request_id": i} for i in range(count)]))
            frames = await recv_frames(ws, MAX_BATCH_FRAMES)  # the first 1,024 request ids (RFC 0005)
            assert [f["request_id"] for f in frames] == list(range(MAX_BATCH_FRAMES))
            assert {f["data"]["code"] for f in frames} == {"VALIDATION_ERROR"}
            assert frames[0]["data"]["max_batch_frames"] == MAX_BATCH_FRAMES
            assert httpx.get(server_url + "/stats").json()["sessions"] == before  # no session was opened
            await ws.send(json.dumps({"type": "ping", "request_id": "after"}))
            (pong,) = await recv_frames(ws, 1)  # nothing else was sent before it
            assert pong["type"] == "pong" and pong["request_id"] == "after"

    run(main())


def test_oversize_batch_gets_frame_too_large_for_each_request(server_url) -> None:
    async def main() -> None:
        async with websockets.connect(ws_url(server_url, "?batch=1"), max_size=None) as ws:
            filler = "x" * (300 << 10)
            batch = [{"type": "ping", "request_id": f"big{i}", "data": {"pad": filler}} for i in range(4)]
            await ws.send(json.dumps(batch))  # about 1.2 MiB, over the default 1 MiB
            frames = await recv_frames(ws, 4)
            assert [f["request_id"] for f in frames] == ["big0", "big1", "big2", "big3"]
            assert {f["data"]["code"] for f in frames} == {"FRAME_TOO_LARGE"}

    run(main())


@pytest.mark.parametrize("query", ["", "?batch=0"])
def test_without_batch_replies_to_a_batch_come_one_frame_per_message(server_url, query: str) -> None:
    async def main() -> None:
        async with websockets.connect(ws_url(server_url, query), max_size=None) as ws:
            await ws.send(json.dumps([{"type": "ping", "request_id": 1}, {"type": "teleport", "request_id": 2},
                                      {"type": "ping", "request_id": 3}]))
            replies = [json.loads(await asyncio.wait_for(ws.recv(), 15)) for _ in range(3)]
            assert all(isinstance(r, dict) for r in replies)
            assert [(r["request_id"], r["type"]) for r in replies] == [(1, "pong"), (2, "error"), (3, "pong")]

    run(main())


def test_flood_of_id_less_elements_gets_one_error_and_the_connection_works(server_url) -> None:
    """An over-long batch of bare values (and an oversize one) is answered once, not once per
    element: the server does not turn a few bytes per element into an error frame each."""
    async def main() -> None:
        async with websockets.connect(ws_url(server_url, "?batch=1"), max_size=None) as ws:
            await ws.send("[" + ",".join(["1"] * 200_000) + "]")  # 400 KB, 200,000 elements
            (refusal,) = await recv_frames(ws, 1)
            assert refusal["request_id"] is None and refusal["data"]["code"] == "VALIDATION_ERROR"
            await ws.send("[" + ",".join(["1"] * 600_000) + "]")  # 1.2 MB: over max_frame_bytes
            (refusal,) = await recv_frames(ws, 1)
            assert refusal["request_id"] is None and refusal["data"]["code"] == "FRAME_TOO_LARGE"
            await ws.send(json.dumps({"type": "ping", "request_id": "still here"}))
            (pong,) = await recv_frames(ws, 1)
            assert pong["type"] == "pong" and pong["request_id"] == "still here"

    run(main())


def test_request_ids_over_64_bits_are_refused_and_the_connection_works(server_url) -> None:
    """A reply must carry the request id back, and a JSON integer over 64 bits cannot be written:
    such a frame is refused (alone or in a batch) instead of failing in the reply."""
    big = 2**64
    async def main() -> None:
        async with websockets.connect(ws_url(server_url, "?batch=1"), max_size=None) as ws:
            await ws.send(json.dumps({"type": "ping", "request_id": big}))
            (alone,) = await recv_frames(ws, 1)
            assert alone["type"] == "error" and alone["data"]["code"] == "VALIDATION_ERROR"
            await ws.send(json.dumps([{"type": "ping", "request_id": 2**64 - 1}, {"type": "ping", "request_id": big},
                                      {"type": "ping", "request_id": -(2**63)}]))
            frames = await recv_frames(ws, 3)
            assert [(f["type"], f["request_id"]) for f in frames] == [
                ("pong", 2**64 - 1), ("error", None), ("pong", -(2**63))]

    run(main())


def test_whole_batches_after_a_bad_one_are_answered_in_order(server_url) -> None:
    """A batch with a bad frame answers each frame on its own (the bad one with an error); the
    connection's later batches are answered as before."""
    async def main() -> None:
        async with websockets.connect(ws_url(server_url, "?batch=1"), max_size=None) as ws:
            await ws.send(json.dumps([{"type": "ping", "request_id": 1}, {"type": "ping", "request_id": 2, "data": 3},
                                      {"type": "ping", "request_id": 3}]))
            frames = await recv_frames(ws, 3)
            assert [(f["request_id"], f["type"]) for f in frames] == [(1, "pong"), (2, "error"), (3, "pong")]
            for first in (10, 20, 30):
                await ws.send(json.dumps([{"type": "open", "request_id": first}, {"type": "ping", "request_id": first + 1}]))
                opened, pong = await recv_frames(ws, 2)
                assert (opened["type"], opened["request_id"], pong["type"], pong["request_id"]) == (
                    "opened", first, "pong", first + 1)

    run(main())
