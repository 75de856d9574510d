"""Fairness under hostile input: honest sessions' throughput and step latency while other
sessions flood the server with hostile answers.

One fresh ``mathdebate serve`` (built-in problems) per run. Honest load: ``--honest`` sessions on
one batching ``/ws/mux`` connection, each playing whole debates with the reference answer (every
grade known on the event loop), as ``env_throughput.py``'s ``cached`` workload. Flood:
``--hostile`` sessions answering, as solver and judge, exponent towers, huge factorials and
powers, thousands of nested braces, roots and fractions, 20,000-digit numbers, 30 KB sums and
code-injection text, each made unique so no verdict cache helps. Modes, interleaved in each
repeat:

- ``calm``: the honest sessions alone (the baseline);
- ``flood-other``: the flood on a second connection;
- ``flood-same``: the flood on the honest sessions' own connection (a trainer whose own policy
  emits garbage).

Reported per mode: honest steps/s, p50/p99 step latency (ms), honest errors; median over
``--repeats``; then the ratios against calm (targets: p99 at most 2x calm, steps/s at least 70%
of calm, 0 honest errors). The last line is one JSON object.

Usage: ``python benchmarks/hostile_load.py [--honest 200] [--hostile 40] [--seconds 8] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
from pathlib import Path

from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_throughput import (
    MuxConnection,
    Tally,
    Workload,
    make_workload,
    measure,
    mux_session,
    row_of,
    server,
)

from env_server.debate.problems import load_problem_source
from env_server.provenance import provenance, server_info

HOSTILE = [
    r"9^{9^{9^{9^{9}}}}",
    r"100000!",
    r"10^{10^{100}}",
    "{" * 3000 + "1" + "}" * 3000,
    "{" * 5000,
    "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "\\frac{1}{" * 1000 + "2" + "}" * 1000,
    "7" * 20_000,
    "1+" * 15_000 + "1",
    "__import__('os').system('true')",
    "().__class__.__bases__[0].__subclasses__()",
]


def hostile_workload() -> Workload:
    """Hostile solver and judge answers, each unique (a counter appended), on built-in problems."""
    source = load_problem_source(None)
    ids = itertools.cycle([source.by_seed(i).problem_id for i in range(64)])
    payloads = itertools.cycle(HOSTILE)
    counter = itertools.count()

    def episode() -> tuple[str, str, str]:
        return (next(ids), f"\\boxed{{{next(payloads)}+{next(counter)}}}", f"\\boxed{{{next(payloads)}+{next(counter)}}}")

    return Workload("hostile", None, episode)


async def run(url: str, mode: str, honest: int, hostile: int, seconds: float) -> Tally:
    ws_url = url.replace("http", "ws") + "/ws/mux?batch=1"

    async def open_connection() -> MuxConnection:
        ws = await connect(ws_url, max_size=None, compression=None, open_timeout=60, ping_interval=None)
        return MuxConnection(ws, batch=True)

    honest_conn = await open_connection()
    flood_conn = honest_conn if mode == "flood-same" else await open_connection()
    tally, opened, go, stop = Tally(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    flood_tally, flood_opened, flood_go = Tally(), asyncio.Event(), asyncio.Event()
    flood_go.set()
    ready, flood_ready = [0, honest], [0, hostile]
    workload = make_workload("cached")
    tasks = [asyncio.create_task(mux_session(honest_conn, workload, tally, opened, go, stop, ready))
             for _ in range(honest)]
    flood = []
    if mode != "calm":
        bad = hostile_workload()
        flood = [asyncio.create_task(mux_session(flood_conn, bad, flood_tally, flood_opened, flood_go, stop, flood_ready))
                 for _ in range(hostile)]
        await asyncio.sleep(1.0)  # the flood is in full swing before the honest window opens
    await measure(tally, opened, go, stop, seconds, tasks)
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    for conn in {honest_conn, flood_conn}:
        await conn.ws.close()
        conn.reader.cancel()
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--honest", type=int, default=200)
    parser.add_argument("--hostile", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="grading workers")
    parser.add_argument("--grading-timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    modes = ["calm", "flood-other", "flood-same"]
    rows: dict[str, list] = {mode: [] for mode in modes}
    servers: list[dict] = []  # what the server says about itself (the provenance)
    for repeat in range(args.repeats):
        for mode in modes:
            with server("ours", None, args.workers, 20_000) as (url, _pid):
                servers[:] = servers or [server_info(url)]
                tally = asyncio.run(run(url, mode, args.honest, args.hostile, args.seconds))
            row = row_of("ours", mode, args.honest, tally)
            rows[mode].append(row)
            print(f"repeat {repeat} {mode:12s} {row.steps_per_s:9.1f} steps/s  p50 {row.p50_ms:7.2f} ms  "
                  f"p99 {row.p99_ms:7.2f} ms  errors {row.errors}", flush=True)
    summary = {}
    for mode in modes:
        summary[mode] = {
            "steps_per_s": statistics.median(r.steps_per_s for r in rows[mode]),
            "p50_ms": statistics.median(r.p50_ms for r in rows[mode]),
            "p99_ms": statistics.median(r.p99_ms for r in rows[mode]),
            "errors": sum(r.errors for r in rows[mode]),
        }
    calm = summary["calm"]
    print(f"\n{'mode':12s} {'steps/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99/calm':>9s} {'steps/calm':>11s} errors")
    for mode in modes:
        s = summary[mode]
        s["p99_ratio"] = round(s["p99_ms"] / calm["p99_ms"], 2)
        s["steps_ratio"] = round(s["steps_per_s"] / calm["steps_per_s"], 2)
        print(f"{mode:12s} {s['steps_per_s']:9.1f} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['p99_ratio']:9.2f} "
              f"{s['steps_ratio']:11.2f} {s['errors']}")
    print(json.dumps({"honest": args.honest, "hostile": args.hostile, "repeats": args.repeats, **summary,
                      "provenance": {**provenance(vars(args)), "env_servers": servers}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
