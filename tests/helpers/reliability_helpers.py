"""Raw-frame helpers shared by the reliability tests (fuzzing, hostile input, faults, bursts)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from env_server.cli import wait_healthy
from env_server.debate.problems import load_problem_source
from env_server.protocol.models import ErrorCode

ERROR_CODES = {code.value for code in ErrorCode}
PROBLEMS = load_problem_source(None)


def ws_url(http_url: str, path: str) -> str:
    return http_url.replace("http", "ws", 1) + path


def open_ws(http_url: str, path: str) -> ClientConnection:
    return connect(ws_url(http_url, path), max_size=None, open_timeout=30)


class RawMux:
    """A blocking /ws/mux connection speaking raw frames; pushes are set aside."""

    def __init__(self, http_url: str) -> None:
        self.ws = open_ws(http_url, "/ws/mux")
        self.ids = 0
        self.pushes: list[dict[str, Any]] = []

    def send_raw(self, raw: str | bytes) -> None:
        self.ws.send(raw)

    def next_reply(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next frame that is not a push."""
        deadline = time.monotonic() + timeout
        while True:
            frame = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if frame.get("request_id") is None and frame["type"] in ("rewards", "session_closed"):
                self.pushes.append(frame)
                continue
            return frame

    def request(self, type_: str, session_id: str | None = None, data: Any = None) -> dict[str, Any]:
        self.ids += 1
        frame: dict[str, Any] = {"type": type_, "request_id": f"q{self.ids}"}
        if session_id is not None:
            frame["session_id"] = session_id
        if data is not None:
            frame["data"] = data
        self.ws.send(json.dumps(frame))
        reply = self.next_reply()
        assert reply["request_id"] == f"q{self.ids}", reply
        return reply

    def close(self) -> None:
        self.ws.close()


def play_reference_episode(mux: RawMux, seed: int, session_id: str | None = None,
                           answer: str | None = None) -> dict[str, Any]:
    """Play one whole debate (the reference answer unless ``answer``) and return its rewards record."""
    problem = PROBLEMS.by_seed(seed)
    if session_id is None:
        session_id = mux.request("open")["session_id"]
    assert mux.request("reset", session_id, {"problem_id": problem.problem_id})["type"] == "observation"
    text = f"Therefore \\boxed{{{answer if answer is not None else problem.answer}}}."
    for role, content in (("solver", text), ("verifier", "Checked. VERDICT: CORRECT"), ("judge", text)):
        reply = mux.request("step", session_id, {"role": role, "content": content})
        assert reply["type"] == "observation", reply
    reply = mux.request("rewards", session_id, {"wait": True, "timeout_s": 30})
    assert reply["data"]["status"] == "graded", reply
    return reply["data"]["record"]


@contextmanager
def killable_server(port: int, *extra: str, log_path: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``mathdebate serve`` on a fixed ``port`` (so a restart can take it again) with one
    grading worker; yields the process, which a test may SIGKILL; SIGKILLed on exit if alive.
    Output goes to ``log_path`` (appended) when given."""
    log = log_path.open("ab") if log_path is not None else None
    level = "info" if log is not None else "warning"
    try:
        process = subprocess.Popen([sys.executable, "-m", "env_server.cli", "serve", "--port", str(port),
                                    "--log-level", level, "--grading-workers", "1", *extra],
                                   stdout=log, stderr=subprocess.STDOUT if log is not None else None)
    finally:
        if log is not None:
            log.close()
    try:
        wait_healthy(f"http://127.0.0.1:{port}", process=process)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
