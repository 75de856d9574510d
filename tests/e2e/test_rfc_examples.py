"""The RFCs' frame examples, replayed against a live server.

Each ```` ```json client ```` block is sent in order on one connection to the endpoint named by
the RFC's ``<!-- frames: ... -->`` line; each ```` ```json server ```` block must match the next
frame received. ``"<...>"`` matches any value. A string ``"<name>"`` matches any value and binds
``name``; a bound name must match the same value again and is substituted in later client frames.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import websockets

RFC_DIR = Path(__file__).resolve().parents[2] / "rfcs"
BLOCK = re.compile(r"```json (client|server)\n(.*?)```", re.DOTALL)
ENDPOINT = re.compile(r"<!-- frames: (\S+) -->")
PLACEHOLDER = re.compile(r"^<([a-z_]+)>$")
WILDCARD = "<...>"

RFCS = sorted(RFC_DIR.glob("0*.md"))


def test_every_extension_has_an_rfc_with_examples() -> None:
    assert [p.name[:4] for p in RFCS] == ["0001", "0002", "0003", "0004", "0005", "0006", "0007"]
    for path in RFCS:
        assert BLOCK.search(path.read_text()), f"{path.name} has no frame examples"


def match(expected: Any, actual: Any, bound: dict[str, Any], where: str = "$") -> None:
    if expected == WILDCARD:
        return
    if isinstance(expected, str) and (m := PLACEHOLDER.match(expected)):
        name = m.group(1)
        if name in bound:
            assert actual == bound[name], f"{where}: <{name}> was {bound[name]!r}, now {actual!r}"
        else:
            bound[name] = actual
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        assert set(expected) == set(actual), f"{where}: keys {sorted(expected)} != {sorted(actual)}"
        for key in expected:
            match(expected[key], actual[key], bound, f"{where}.{key}")
        return
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            match(e, a, bound, f"{where}[{i}]")
        return
    assert expected == actual, f"{where}: expected {expected!r}, got {actual!r}"


def substitute(value: Any, bound: dict[str, Any]) -> Any:
    if isinstance(value, str) and (m := PLACEHOLDER.match(value)):
        return bound[m.group(1)]
    if isinstance(value, dict):
        return {k: substitute(v, bound) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, bound) for v in value]
    return value


@pytest.mark.parametrize("path", RFCS, ids=lambda p: p.name)
def test_rfc_examples_against_the_server(server_url, path: Path) -> None:
    text = path.read_text()
    endpoint = ENDPOINT.search(text).group(1)
    blocks = [(kind, json.loads(body)) for kind, body in BLOCK.findall(text)]

    async def main() -> None:
        bound: dict[str, Any] = {}
        async with websockets.connect(server_url.replace("http", "ws") + endpoint) as ws:
            for i, (kind, frame) in enumerate(blocks):
                if kind == "client":
                    await ws.send(json.dumps(substitute(frame, bound)))
                else:
                    actual = json.loads(await asyncio.wait_for(ws.recv(), 15))
                    match(frame, actual, bound, f"{path.name} block {i}")

    asyncio.run(main())
