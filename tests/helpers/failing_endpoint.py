"""A local HTTP server that fails OpenAI's ``/v1/chat/completions`` on purpose, each way a real
endpoint fails, chosen by the request's ``model``:

- ``context-400`` (and any model named ``context-400-...``): HTTP 400 with a body in vLLM's
  layout for a prompt longer than the context (``{"error": {"message": ..., "type":
  "BadRequestError", "code": 400}}``, :data:`CONTEXT_MESSAGE`);
- ``hang``: answers only after :attr:`FailingEndpoint.hang_s` seconds (longer than the client's timeout);
- ``drop``: sends the status line, headers promising a body and half of it, then closes the
  connection (a server that dies mid-reply);
- ``not-json``: HTTP 200 whose body is not a chat completion (an HTML error page);
- ``bad-tool-call``: a well-formed chat completion whose message is a tool call with arguments
  that are not JSON and no text (the model's own invalid call, not a failed request);
- ``every-other``: the 1st, 3rd, 5th... request fails as ``context-400`` does; the others are
  answered with the gold answer of the problem in the chat (:attr:`FailingEndpoint.gold`);
- anything else: a plain reply that boxes the gold answer (a working model).

A raw :class:`http.server.ThreadingHTTPServer` on a real socket, so that a connection can be cut
mid-reply (an ASGI server always finishes its responses). ``requests`` counts requests per model.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: vLLM 0.31's message for a prompt longer than ``--max-model-len`` (its wording as the vLLM-on-CPU
#: check saw it, ``tests/e2e/test_vllm_cpu.py``, with this example's numbers).
CONTEXT_MESSAGE = ("This model's maximum context length is 1024 tokens. However, you requested 1024 output tokens and "
                   "your prompt contains at least 1321 input tokens, for a total of at least 2345 tokens. Please reduce "
                   "the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, "
                   "value=1321)")


class FailingEndpoint:
    """The server's state: requests per model, how long ``hang`` waits, the gold answers
    (problem text -> answer)."""

    def __init__(self, hang_s: float = 3.0, gold: dict[str, str] | None = None) -> None:
        self.hang_s = hang_s
        self.gold = gold or {}
        self.requests: Counter[str] = Counter()
        self.lock = threading.Lock()

    def gold_of(self, body: dict) -> str:
        """The gold answer of the problem the chat is about (``"0"`` when unknown)."""
        text = "\n".join(str(m.get("content") or "") for m in body["messages"])
        return next((answer for problem, answer in self.gold.items() if problem in text), "0")


def _completion(model: str, message: dict) -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": message}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }).encode()


def _handler(state: FailingEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model = body["model"]
            with state.lock:
                state.requests[model] += 1
                count = state.requests[model]
            if model.startswith("context-400") or (model == "every-other" and count % 2 == 1):
                self._send(400, json.dumps({"error": {"message": CONTEXT_MESSAGE, "type": "BadRequestError",
                                                      "param": None, "code": 400}}).encode())
            elif model == "hang":
                time.sleep(state.hang_s)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up long ago
                    self._send(200, _completion(model, {"role": "assistant", "content": "too late"}))
            elif model == "drop":
                payload = _completion(model, {"role": "assistant", "content": "cut"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[:len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.close()  # mid-reply: the client has half of what it was promised
            elif model == "not-json":
                self._send(200, b"<html><body>502 upstream went away</body></html>", "application/json")
            elif model == "bad-tool-call":
                self._send(200, _completion(model, {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "submit_solution", "arguments": "{\"solution\": \"7"}}]}))
            else:
                self._send(200, _completion(model, {
                    "role": "assistant", "content": f"The answer is $\\boxed{{{state.gold_of(body)}}}$."}))

        def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def serve_failing_endpoint(hang_s: float = 3.0, gold: dict[str, str] | None = None
                           ) -> Iterator[tuple[str, FailingEndpoint]]:
    """Serve the endpoint on a free loopback port; yield ``(base_url ending in /v1, state)``."""
    state = FailingEndpoint(hang_s, gold)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    server.block_on_close = False  # a hanging request's thread is not waited for
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    finally:
        server.shutdown()
        server.server_close()
