"""Server CPU per step on ``/ws/mux``'s own path, in process: no sockets, no load generator.

``env_throughput.py`` measures the real server beside its load generator on the same cores, so
a change of a few percent in the server's code drowns in the machine's noise. This script runs
the server's code alone: a ``DebateService`` (1 grading worker, default retention) and
``--connections`` ``MuxConnection``s served as the route serves them (``run()``) over a WebSocket
that hands out messages built beforehand and counts what is sent, ``--sessions`` sessions, and
whole debates (reset, solver, verifier accepts, judge; reference answers, so every grade is
known without a worker), one batch message (RFC 0005) per phase and connection. It reports the
process's CPU time (``time.process_time``) per step, episode grading, rewards push and batch
writing included, after a warm-up that fills retention.
Uvicorn's and the websockets library's share (the socket, the framing) is not in it.

Each tree (``--trees``, default: this checkout) runs in its own subprocess with that tree's
``env_server`` first on ``sys.path``; trees alternate within every repeat. Compare two commits::

    git worktree add /tmp/before <commit>
    python benchmarks/mux_path.py --trees /tmp/before . --repeats 5

Prints one line per run, then one JSON line: per tree the median us per step and its runs, and
``ratio`` (each tree's median over the first tree's; lower is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERDICT = "The derivation holds. VERDICT: CORRECT"


class _ScriptedSocket:
    """The WebSocket of a ``MuxConnection``: hands out queued messages, counts what is sent."""

    def __init__(self) -> None:
        self.sent = 0
        self.queue: deque[bytes] = deque()
        self.drained = asyncio.Event()
        self._more = asyncio.Event()

    def feed(self, messages: list[bytes]) -> None:
        self.queue.extend(messages)
        self.drained.clear()
        self._more.set()

    async def receive(self) -> dict[str, Any]:
        while not self.queue:
            self.drained.set()
            self._more.clear()
            await self._more.wait()
        raw = self.queue.popleft()
        if not raw:
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.receive", "bytes": raw}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent += 1


async def _measure(sessions: int, connections: int, rounds: int) -> float:
    """us of process CPU per step over ``rounds`` rounds of one episode per session.

    Raises:
        RuntimeError: not every episode was played through and graded (a broken tree).
    """
    import orjson

    from env_server.cli import tune_gc
    from env_server.debate.problems import load_problem_source
    from env_server.grading.pool import GradingConfig
    from env_server.service.config import ServerConfig
    from env_server.service.facade import DebateService
    from env_server.transport.mux import MuxConnection

    service = DebateService(ServerConfig(max_sessions=sessions + 100, max_sessions_per_connection=sessions,
                                         grading=GradingConfig(workers=1)))
    await service.start()
    tune_gc()
    sockets = [_ScriptedSocket() for _ in range(connections)]
    conns = [MuxConnection(ws, service, batch=True) for ws in sockets]  # type: ignore[arg-type]  # receive and send are all it uses
    served = [asyncio.create_task(conn.run()) for conn in conns]
    per = sessions // connections
    for ws in sockets:
        ws.feed([orjson.dumps([{"type": "open", "request_id": i} for i in range(per)])])

    async def drained() -> None:
        for ws in sockets:
            await ws.drained.wait()
        await asyncio.sleep(0.01)  # the last replies written, the last records pushed

    await drained()
    source = load_problem_source(None)
    problems = [source.by_seed(i) for i in range(64)]

    def episode(conn: MuxConnection, problem: Any) -> list[bytes]:
        ids = sorted(conn.session_ids)
        text = f"The answer is \\boxed{{{problem.answer}}}."
        out = [orjson.dumps([{"type": "reset", "request_id": i, "session_id": s, "data": {"problem_id": problem.problem_id}}
                             for i, s in enumerate(ids)])]
        for role, content in (("solver", text), ("verifier", VERDICT), ("judge", text)):
            out.append(orjson.dumps([{"type": "step", "request_id": i, "session_id": s,
                                      "data": {"role": role, "content": content}} for i, s in enumerate(ids)]))
        return out

    def play(first: int, count: int) -> None:
        for ws, conn in zip(sockets, conns, strict=True):
            ws.feed([raw for k in range(first, first + count) for raw in episode(conn, problems[k % len(problems)])])

    play(0, 40)  # warm-up: caches, and retention filling up
    await drained()
    graded_before = service.counters["episodes_graded"]
    start = time.process_time()
    play(40, rounds)
    await drained()
    spent = time.process_time() - start
    graded = service.counters["episodes_graded"] - graded_before
    for ws in sockets:
        ws.feed([b""])  # disconnect
    await asyncio.gather(*served)
    await service.shutdown()
    if graded != rounds * per * connections:  # every debate played through and graded, or the figure means nothing
        raise RuntimeError(f"{graded} episodes graded, expected {rounds * per * connections}")
    return spent / (rounds * per * connections * 3) * 1e6


def _child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.tree).resolve()))
    print(json.dumps({"us_per_step": asyncio.run(_measure(args.sessions, args.connections, args.rounds))}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", default=[str(ROOT)], help="checkouts to measure; the first is the baseline")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30, help="measured episodes per session per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    runs: dict[str, list[float]] = {tree: [] for tree in args.trees}
    for repeat in range(args.repeats):
        for tree in args.trees:
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--tree", tree, "--sessions", str(args.sessions),
                 "--connections", str(args.connections), "--rounds", str(args.rounds)],
                capture_output=True, text=True, check=True, cwd=tree).stdout
            runs[tree].append(json.loads(out.strip().splitlines()[-1])["us_per_step"])
            print(f"repeat {repeat + 1}: {tree}: {runs[tree][-1]:.2f} us per step", flush=True)
    medians = {tree: statistics.median(values) for tree, values in runs.items()}
    baseline = medians[args.trees[0]]
    sys.path.insert(0, str(ROOT))
    from env_server.provenance import provenance

    print(json.dumps({"us_per_step": medians, "runs": runs,
                      "ratio": {tree: round(m / baseline, 3) for tree, m in medians.items()},
                      "provenance": provenance(vars(args))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
