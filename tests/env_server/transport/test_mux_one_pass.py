"""How ``/ws/mux`` parses a batch (RFC 0005): in one pass while batches come whole, frame by
frame after a bad one until a batch comes whole again, so a client sending bad batches is not
parsed twice per message. A real ``DebateService`` and ``MuxConnection``; the WebSocket is
a list of sent messages (what is counted here is parsing, not the socket)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from env_server.grading.pool import GradingConfig
from env_server.service.config import ServerConfig
from env_server.service.facade import DebateService
from env_server.transport import mux


class SentMessages:
    def __init__(self) -> None:
        self.messages: list[str] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message["text"])


def test_bad_batches_are_parsed_once_and_whole_batches_return_to_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    one_pass_calls: list[bytes] = []
    real = mux._valid_batch

    def counted(raw: bytes) -> list[Any] | None:
        one_pass_calls.append(raw)
        return real(raw)

    monkeypatch.setattr(mux, "_valid_batch", counted)
    good = orjson.dumps([{"type": "ping", "request_id": 1}, {"type": "ping", "request_id": 2}])
    bad = orjson.dumps([{"type": "ping", "request_id": 1}, {"type": "teleport", "request_id": 2}])

    async def main() -> list[list[dict[str, Any]]]:
        service = DebateService(ServerConfig(grading=GradingConfig(workers=1)))
        ws = SentMessages()
        conn = mux.MuxConnection(ws, service, batch=True)  # type: ignore[arg-type]  # a stand-in for the WebSocket: only send is used
        writer = asyncio.create_task(conn._write_loop())
        answers = []
        for raw, one_pass_expected in ((good, True), (bad, True), (bad, False), (good, False), (good, True)):
            before = len(one_pass_calls)
            await conn._handle(raw)
            await asyncio.sleep(0.01)
            assert (len(one_pass_calls) > before) is one_pass_expected, (raw, one_pass_expected)
            answers.append(orjson.loads(ws.messages.pop()))
        writer.cancel()
        return answers

    answers = asyncio.run(main())
    assert [[(f["request_id"], f["type"]) for f in a] for a in answers] == [
        [(1, "pong"), (2, "pong")], [(1, "pong"), (2, "error")], [(1, "pong"), (2, "error")],
        [(1, "pong"), (2, "pong")], [(1, "pong"), (2, "pong")]]
