"""``/ws/mux`` backpressure: a client that does not read makes its replies wait for room in the
outbound queue (``MAX_PENDING_FRAMES``); none is dropped and they go out in order once it reads.
A real ``DebateService`` and ``MuxConnection`` served by ``run()``; the WebSocket is scripted
(its ``send`` blocks until the test lets the client "read")."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import orjson

from env_server.grading.pool import GradingConfig
from env_server.service.config import ServerConfig
from env_server.service.facade import DebateService
from env_server.transport.mux import MAX_PENDING_FRAMES, MuxConnection


class SlowReader:
    """Hands out queued messages; ``send`` waits until ``reading`` is set."""

    def __init__(self, messages: list[bytes]) -> None:
        self.incoming = deque(messages)
        self.reading = asyncio.Event()
        self.received_all = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.incoming:
            self.received_all.set()
            await asyncio.Event().wait()  # the client stays connected
        return {"type": "websocket.receive", "bytes": self.incoming.popleft()}

    async def send(self, message: dict[str, Any]) -> None:
        await self.reading.wait()
        self.sent.extend(orjson.loads(message["text"]))


def test_replies_wait_for_a_client_that_does_not_read_and_all_arrive_in_order() -> None:
    # At most 2 * MAX_PENDING_FRAMES replies are taken before the server must wait: the write loop
    # holds one full list (stuck in ``send``), the queue another; plus the batch being handled. A
    # test that sent fewer passed or failed by when the write loop first ran (a time slice's yield).
    batches, per_batch = 12, 1000
    total = batches * per_batch
    assert total > 2 * MAX_PENDING_FRAMES + 2 * per_batch  # more replies than the server can take unread
    messages = [orjson.dumps([{"type": "ping", "request_id": b * per_batch + i} for i in range(per_batch)])
                for b in range(batches)]

    async def main() -> list[dict[str, Any]]:
        service = DebateService(ServerConfig(grading=GradingConfig(workers=1)))
        socket = SlowReader(messages)
        served = asyncio.create_task(MuxConnection(socket, service, batch=True).run())  # type: ignore[arg-type]  # receive and send are all it uses
        await asyncio.sleep(0.5)
        assert not socket.received_all.is_set()  # held: the queue is full and the client does not read
        assert socket.sent == []
        socket.reading.set()
        await asyncio.wait_for(socket.received_all.wait(), 10)
        for _ in range(100):
            if len(socket.sent) >= total:
                break
            await asyncio.sleep(0.05)
        served.cancel()
        return socket.sent

    sent = asyncio.run(main())
    assert [frame["request_id"] for frame in sent] == list(range(total))
    assert {frame["type"] for frame in sent} == {"pong"}
