"""Soak: hold many concurrent debates on one server for a long time and watch for drift.

Starts ``mathdebate serve`` (built-in problems), opens ``--sessions`` sessions over
``--connections`` ``/ws/mux`` connections and plays whole debates in each until ``--minutes``
have passed: a mix of correct answers (the reference answer) and wrong ones (a fresh cube
root, ``\\sqrt[3]{N}``, which no event-loop fast path decides, so part of the load reaches the
grading workers), every episode waiting for its pushed rewards before the next one. The
connections batch frames (RFC 0005), as ``env_server.client.MuxClient`` does by default.
Every ``--interval`` seconds it prints completed episodes, errors, p50/p99 step latency of
that interval and the server's resident memory (``VmRSS``).

Usage: ``python benchmarks/soak.py --sessions 1000 --minutes 10``. Prints the interval table,
then one JSON line: episodes, errors, p99 per interval, RSS at start and end and the growth.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from env_throughput import VERDICT, MuxConnection, connect, percentile, rss_kb, server

from env_server.debate.problems import load_problem_source
from env_server.provenance import provenance, server_info


async def soak(url: str, pid: int, sessions: int, connections: int, seconds: float, interval: float,
               wrong_fraction: float) -> dict:
    source = load_problem_source(None)
    problems = [source.by_seed(i) for i in range(2000)]
    counter = itertools.count(10_000_019)
    rng = random.Random(0)
    ws_url = url.replace("http", "ws") + "/ws/mux?batch=1"
    conns = [MuxConnection(await connect(ws_url, max_size=None, compression=None, ping_interval=None), batch=True)
             for _ in range(connections)]
    latencies: list[float] = []
    totals = {"episodes": 0, "errors": 0, "correct": 0}
    stop = asyncio.Event()

    async def play(i: int) -> None:
        conn = conns[i % len(conns)]
        session_id = (await conn.request("open"))["session_id"]
        while not stop.is_set():
            problem = rng.choice(problems)
            wrong = rng.random() < wrong_fraction
            answer = f"\\sqrt[3]{{{next(counter)}}}" if wrong else problem.answer
            reply = await conn.request("reset", session_id, {"problem_id": problem.problem_id})
            if reply["type"] != "observation":
                totals["errors"] += 1
                continue
            graded = asyncio.get_running_loop().create_future()
            conn.rewards[session_id] = graded
            for role, content in (("solver", f"\\boxed{{{answer}}}"), ("verifier", VERDICT),
                                  ("judge", f"\\boxed{{{answer}}}")):
                start = time.perf_counter()
                reply = await conn.request("step", session_id, {"role": role, "content": content})
                latencies.append((time.perf_counter() - start) * 1000)
                if reply["type"] != "observation":
                    totals["errors"] += 1
                    break
                if reply["data"]["done"]:
                    break
            record = (await graded)["data"]["record"]
            totals["episodes"] += 1
            totals["correct"] += int(record["episode_reward"] == (0.0 if wrong else 1.0))

    tasks = [asyncio.create_task(play(i)) for i in range(sessions)]
    rss_start = rss_kb(pid)
    intervals = []
    began = time.monotonic()
    last_episodes = 0
    print(f"{'t (s)':>6} {'episodes':>9} {'errors':>7} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8}")
    while time.monotonic() - began < seconds:
        await asyncio.sleep(interval)
        window, latencies[:] = latencies[:], []
        row = {"t": round(time.monotonic() - began), "episodes": totals["episodes"] - last_episodes,
               "errors": totals["errors"], "p50_ms": round(percentile(window, 0.5), 2),
               "p99_ms": round(percentile(window, 0.99), 2), "rss_mib": round(rss_kb(pid) / 1024, 1)}
        last_episodes = totals["episodes"]
        intervals.append(row)
        print(f"{row['t']:6d} {row['episodes']:9d} {row['errors']:7d} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} "
              f"{row['rss_mib']:8.1f}", flush=True)
        if any(t.done() and t.exception() for t in tasks):
            failed = next(t for t in tasks if t.done() and t.exception())
            raise RuntimeError(f"a session failed: {failed.exception()!r}")
    stop.set()
    await asyncio.wait(tasks, timeout=60)
    rss_end = rss_kb(pid)
    for conn in conns:
        await conn.ws.close()
    return {"episodes": totals["episodes"], "episodes_with_expected_reward": totals["correct"],
            "errors": totals["errors"], "intervals": intervals, "rss_start_mib": round(rss_start / 1024, 1),
            "rss_end_mib": round(rss_end / 1024, 1),
            # growth after the first interval (allocator warm-up) is what would signal a leak
            "rss_growth_after_warmup_mib": round(rss_end / 1024 - intervals[0]["rss_mib"], 1) if intervals else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds per reported interval")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--wrong-fraction", type=float, default=0.2, help="share of fresh wrong answers")
    parser.add_argument("--grading-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    args = parser.parse_args(argv)
    with server("ours", None, args.grading_workers, args.sessions * 2 + 100) as (url, pid):
        servers = [server_info(url)]  # what the server says about itself (the provenance)
        result = asyncio.run(soak(url, pid, args.sessions, args.connections, args.minutes * 60, args.interval,
                                  args.wrong_fraction))
    print(f"\nmachine: {platform.platform()}, {os.cpu_count()} CPUs; {args.sessions} sessions, "
          f"{args.minutes:g} min; episodes {result['episodes']}, errors {result['errors']}, "
          f"RSS {result['rss_start_mib']} -> {result['rss_end_mib']} MiB")
    print(json.dumps({**result, "provenance": {**provenance(vars(args)), "env_servers": servers}}))
    return 0 if result["errors"] == 0 and result["episodes"] == result["episodes_with_expected_reward"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
