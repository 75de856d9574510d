"""A local HTTP server that speaks OpenAI's ``/v1/chat/completions`` protocol, deterministically.

Served by uvicorn on a real socket (a thread of the test process). It knows the gold answers
(problem text -> answer) and plays every role by the request's ``model``:

- ``oracle``: the solver boxes the gold answer; the verifier says CORRECT exactly when the
  proposed solution's last box equals the gold answer; the judge boxes the last box of the
  debate it is shown;
- ``wrong``: the solver boxes a wrong answer (``gold`` with ``7`` appended);
- ``sampler``: the k-th solver request for a problem (k = 0, 1, ...) boxes the gold answer when
  k is even and the distinct wrong answer ``99999k`` when k is odd;
- ``verifier-logprobs``: the oracle's verdict, with ``logprobs`` when asked: at the verdict token
  the alternatives give P(CORRECT) = 0.9 for a right answer, 0.2 for a wrong one;
- ``broken``: every request fails with HTTP 500;
- ``flaky``: the first request with a given body fails with HTTP 503, a repeat succeeds.

A request with ``"stream": true`` gets the same reply as server-sent events (one content chunk,
one with the finish reason, the usage when ``stream_options.include_usage``, then ``[DONE]``).

``requests`` counts the requests per model, ``bodies`` keeps every request body and
``authorization`` every ``Authorization`` header.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request  # module level: the route's annotations are resolved from here
from fastapi.responses import JSONResponse, StreamingResponse

from env_server.debate.answers import last_boxed


def _last_box(text: str) -> str | None:
    return last_boxed(text)


class ChatFixture:
    """State and behaviour of the fixture (see the module docstring)."""

    def __init__(self, gold: dict[str, str]) -> None:
        self.gold = gold
        self.requests: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.solver_calls: Counter[str] = Counter()
        self.seen: set[str] = set()
        self.authorization: list[str | None] = []
        self.lock = threading.Lock()

    def _problem(self, messages: list[dict[str, str]]) -> str | None:
        text = "\n".join(m["content"] for m in messages if m["role"] == "user")
        return next((p for p in self.gold if p in text), None)

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for one request."""
        model, messages = body["model"], body["messages"]
        with self.lock:
            self.requests[model] += 1
            self.bodies.append(body)
            if model == "broken":
                return 500, {"error": {"message": "fixture: broken model", "type": "server_error"}}
            key = json.dumps(body, sort_keys=True)
            if model == "flaky" and key not in self.seen:
                self.seen.add(key)
                return 503, {"error": {"message": "fixture: try again", "type": "server_error"}}
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        problem = self._problem(messages)
        gold = self.gold.get(problem or "", "0")
        logprobs = None
        if system.startswith("You are the verifier"):
            proposed = messages[-1]["content"]
            right = _last_box(proposed) == gold
            word = "CORRECT" if right else "INCORRECT"
            content = f"I checked the solution.\nVERDICT: {word}"
            if model == "verifier-logprobs" and body.get("logprobs"):
                p_accept = 0.9 if right else 0.2
                top = [{"token": " CORRECT", "logprob": math.log(p_accept), "bytes": None},
                       {"token": " INCORRECT", "logprob": math.log(1 - p_accept), "bytes": None}]
                tokens = ["I checked the solution.\n", "VERDICT", ":", f" {word}"]
                logprobs = {"content": [
                    {"token": tok, "logprob": -0.1, "bytes": None,
                     "top_logprobs": top if k == 3 else []} for k, tok in enumerate(tokens)]}
        elif system.startswith("You are the judge"):
            answer = _last_box("\n".join(m["content"] for m in messages if m["role"] == "user"))
            content = f"Having read the debate, the answer is $\\boxed{{{answer}}}$." if answer else "No answer."
        else:
            if model == "sampler":
                with self.lock:
                    k = self.solver_calls[problem or ""]
                    self.solver_calls[problem or ""] += 1
                answer = gold if k % 2 == 0 else f"99999{k}"
            else:
                answer = f"{gold}7" if model == "wrong" else gold
            content = f"Working it out step by step, the answer is $\\boxed{{{answer}}}$."
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        completion_tokens = len(content.split())
        return 200, {
            "id": f"chatcmpl-{self.requests[model]}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def _events(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A chat completion as OpenAI's streamed ``chat.completion.chunk`` events."""
    choice = body["choices"][0]
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": choice["message"]["content"]},
                                    "logprobs": choice["logprobs"], "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_chat_fixture(gold: dict[str, str]) -> Iterator[tuple[str, ChatFixture]]:
    """Serve the fixture; yield ``(base_url ending in /v1, fixture)``."""
    fixture = ChatFixture(gold)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        fixture.authorization.append(request.headers.get("authorization"))
        asked = await request.json()
        status, body = fixture.answer(asked)
        if status != 200 or not asked.get("stream"):
            return JSONResponse(body, status_code=status)
        return StreamingResponse(_events(body, bool((asked.get("stream_options") or {}).get("include_usage"))),
                                 media_type="text/event-stream")

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the chat fixture did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1", fixture
    finally:
        server.should_exit = True
        thread.join(timeout=10)
