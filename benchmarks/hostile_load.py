"""Fairness under hostile input: honest sessions' throughput and step latency while other
sessions flood the server with hostile answers.

One fresh ``mathdebate serve`` (built-in problems) per run. Honest load: ``--honest`` sessions on
one batching ``/ws/mux`` connection, each playing whole debates with the reference answer (every
grade known on the event loop), as ``env_throughput.py``'s ``cached`` workload, and waiting for
each episode's pushed record before the next.

Flood: ``--hostile`` sessions answering, as solver and judge, answers built to be expensive for
the grader (exponent towers, huge factorials and powers, sums of thousands of terms, thousands
of nested braces, roots and fractions, 4,000-digit numbers, symbolic sums) and code-injection
text. Every answer is unique (a counter inside it), so neither the verdict cache nor a worker's
parse cache helps, and every one is under the server's answer cap, so each reaches a grading
worker (most run to the worker's soft timeout). A flooding session does not wait for its
records: reset, three steps, reset again, as fast as the server answers, so its grades pile up.

Modes, interleaved in each repeat:

- ``calm``: the honest sessions alone (the baseline);
- ``flood-one``: the flood on one second connection;
- ``flood-spread``: the flood spread over ``--flood-connections`` connections (default 40,
  one hostile session each);
- ``flood-same``: the flood on the honest sessions' own connection (a trainer whose own policy
  emits garbage; not run unless named in ``--modes``).

``--fairness off|on|both``: run the server with ``--grading-fairness off`` (grades go to the
workers first come, first served: the server before per-session fair admission) and/or ``on``
(the default). With ``both`` every mode runs under both, interleaved.

Checks beside the timings: honest errors (must be 0); nothing executed (the injection answers
``touch`` a sentinel file that must not exist afterwards); a probe session that, while the flood
runs, plays one episode whose correct answers need a worker (``PROBE``) and reports its reward
(must be 1) and how long its record took (``probe_s``).

Reported per mode: honest steps/s, p50/p99 step latency (ms), honest errors; median over
``--repeats``; then the ratios against calm of the same fairness setting (targets: p99 at most
2x calm, steps/s at least 70% of calm, 0 honest errors). The last line is one JSON object.

Usage::

    python benchmarks/hostile_load.py [--honest 200] [--hostile 40] [--seconds 8] [--repeats 3]
        [--fairness both] [--modes calm flood-one flood-spread]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_throughput import (
    COMPILED_SITE,
    VERDICT,
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

SENTINEL = Path("/tmp/mathdebate-hostile-load-pwned")
#: Hostile answer families; ``{n}`` is a counter, so every answer is new. Each stays under the
#: server's answer cap (``GradingConfig.max_answer_chars``, 8,192) so that it reaches a worker:
#: most run to math-verify's soft timeout (3 s) there.
HOSTILE = [
    r"9^{9^{9^{9^{{n}}}}}",
    r"{n}00000!",
    r"10^{10^{1{n}}}",
    r"2^{2^{2^{2^{2^{{n}}}}}}",
    "{" * 3000 + "{n}" + "}" * 3000,
    "{" * 4000 + "{n}",
    "\\sqrt{" * 1000 + "{n}" + "}" * 1000,
    "\\frac{1}{" * 600 + "{n}" + "}" * 600,
    "7" * 4000 + "{n}",
    "1+" * 3500 + "{n}",
    r"\sum_{k=1}^{10^{{n}}} k^{k}",
    f"__import__('os').system('touch {SENTINEL}')+{{n}}",
    "().__class__.__bases__[0].__subclasses__()[{n}]",
]
#: a correct answer to the probe's problem (``PROBE_PROBLEM``'s gold, ``{gold}``) that no
#: event-loop fast path decides, so it is graded by a worker behind (or beside) the flood
PROBE = r"\left({gold}\right) \cdot \frac{\sin^{2} x + \cos^{2} x}{1}"


#: Hostile text before the answers (and as the verifier's whole critique): deep braces, nested
#: fractions, injection text; ``{n}`` a counter. Not graded (the answer is the box after it),
#: but received, stored and carried by every later observation of the episode.
NOISE = ("{" * 2000 + "}" * 2000 + f" __import__('os').system('touch {SENTINEL}') " +
         "\\frac{1}{" * 500 + "{n}" + "}" * 500 + " ")
#: copies of ``NOISE`` (about 9 KB each) before each solver and judge answer; a critique has one
#: more (the server's action cap is 32 KB)
DEFAULT_NOISE = 2


def hostile_workload(noise: int = DEFAULT_NOISE) -> tuple[Workload, Callable[[], str]]:
    """Hostile solver and judge answers (each unique, on built-in problems), and the verifier's
    critiques (hostile text, each unique)."""
    source = load_problem_source(None)
    ids = itertools.cycle([source.by_seed(i).problem_id for i in range(64)])
    payloads = itertools.cycle(HOSTILE)
    counter = itertools.count(1)

    def text(copies: int) -> str:
        return NOISE.replace("{n}", str(next(counter))) * copies

    def answer() -> str:
        return text(noise) + "\\boxed{" + next(payloads).replace("{n}", str(next(counter))) + "}"

    def episode() -> tuple[str, str, str]:
        return next(ids), answer(), answer()

    return Workload("hostile", None, episode), lambda: text(noise + 1) + " " + VERDICT


async def flood_session(conn: MuxConnection, workload: Workload, critique: Callable[[], str],
                        stop: asyncio.Event, window: Tally, steps: list[int]) -> None:
    """Play hostile episodes back to back without waiting for their records; count the steps
    answered inside the honest sessions' measured window in ``steps[0]``."""
    session_id = (await conn.request("open"))["session_id"]
    while not stop.is_set():
        problem_id, solver, judge = workload.next_episode()
        await conn.request("reset", session_id, {"problem_id": problem_id})
        for role, content in (("solver", solver), ("verifier", critique()), ("judge", judge)):
            reply = await conn.request("step", session_id, {"role": role, "content": content})
            steps[0] += window.measuring
            if reply["type"] != "observation" or reply["data"]["done"]:
                break


#: how long the probe waits for its record (without fair admission it queues behind the whole flood)
PROBE_TIMEOUT_S = 30.0


async def probe(conn: MuxConnection) -> tuple[float, float] | None:
    """One episode with worker-graded correct answers: ``(episode_reward, seconds to its record)``,
    or None when the record is not in within ``PROBE_TIMEOUT_S``."""
    problem = load_problem_source(None).by_seed(7)
    answer = "\\boxed{" + PROBE.replace("{gold}", problem.answer) + "}"
    session_id = (await conn.request("open"))["session_id"]
    await conn.request("reset", session_id, {"problem_id": problem.problem_id})
    graded = asyncio.get_running_loop().create_future()
    conn.rewards[session_id] = graded
    start = time.perf_counter()
    for role, content in (("solver", answer), ("verifier", VERDICT), ("judge", answer)):
        reply = await conn.request("step", session_id, {"role": role, "content": content})
        if reply["data"].get("done"):
            break
    try:
        frame = await asyncio.wait_for(graded, timeout=PROBE_TIMEOUT_S)
    except TimeoutError:
        return None
    return float(frame["data"]["record"]["episode_reward"]), time.perf_counter() - start


async def run(url: str, mode: str, honest: int, hostile: int, flood_connections: int,
              seconds: float, noise: int = DEFAULT_NOISE) -> tuple[Tally, tuple[float, float] | bool | None]:
    ws_url = url.replace("http", "ws") + "/ws/mux?batch=1"

    async def open_connection() -> MuxConnection:
        ws = await connect(ws_url, max_size=None, compression=None, open_timeout=60, ping_interval=None)
        return MuxConnection(ws, batch=True)

    honest_conn = await open_connection()
    flood_conns: list[MuxConnection] = []
    if mode == "flood-same":
        flood_conns = [honest_conn]
    elif mode == "flood-one":
        flood_conns = [await open_connection()]
    elif mode == "flood-spread":
        flood_conns = [await open_connection() for _ in range(min(flood_connections, hostile))]
    tally, opened, go, stop = Tally(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    ready = [0, honest]
    workload = make_workload("cached")
    tasks = [asyncio.create_task(mux_session(honest_conn, workload, tally, opened, go, stop, ready))
             for _ in range(honest)]
    flood_stop = asyncio.Event()
    bad, critique = hostile_workload(noise)
    flood_steps = [0]
    flood = [asyncio.create_task(flood_session(flood_conns[i % len(flood_conns)], bad, critique, flood_stop, tally,
                                               flood_steps))
             for i in range(hostile if flood_conns else 0)]
    probed: tuple[float, float] | bool | None = False  # False: no probe (calm)
    if flood:
        await asyncio.sleep(1.0)  # the flood is in full swing (its grades queued) before the window opens
        probe_task = asyncio.create_task(probe(honest_conn))
    await measure(tally, opened, go, stop, seconds, tasks)
    if flood:
        probed = await probe_task  # the flood goes on until the probe's record is in
    flood_stop.set()
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    for conn in {honest_conn, *flood_conns}:
        await conn.ws.close()
        conn.reader.cancel()
    tally.flood_steps_per_s = flood_steps[0] / getattr(tally, "window", 1.0)  # type: ignore[attr-defined]  # ad-hoc field
    return tally, probed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--honest", type=int, default=200)
    parser.add_argument("--hostile", type=int, default=40)
    parser.add_argument("--flood-connections", type=int, default=40, help="connections of flood-spread")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--noise", type=int, default=DEFAULT_NOISE,
                        help="copies of the hostile text (about 9 KB) before each flood answer and in each critique")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="grading workers")
    parser.add_argument("--grading-timeout", type=float, default=5.0, help="the server's hard kill, seconds")
    parser.add_argument("--modes", nargs="+", default=["calm", "flood-one", "flood-spread"],
                        choices=["calm", "flood-one", "flood-spread", "flood-same"])
    parser.add_argument("--fairness", choices=["on", "off", "both"], default="both",
                        help="the server's --grading-fairness; both: each mode under off and on, interleaved")
    parser.add_argument("--compiled-site", default="",
                        help="a compiled install of mathdebate the server imports first (env_throughput.py's option)")
    args = parser.parse_args(argv)
    COMPILED_SITE[0] = str(Path(args.compiled_site).resolve()) if args.compiled_site else ""
    fairness = ["off", "on"] if args.fairness == "both" else [args.fairness]
    modes = args.modes if "calm" in args.modes else ["calm", *args.modes]
    keys = [f"{mode}/{fair}" for mode in modes for fair in fairness]
    rows: dict[str, list] = {key: [] for key in keys}
    probes: dict[str, list[tuple[float, float] | None]] = {key: [] for key in keys}
    flood_rates: dict[str, list[float]] = {key: [] for key in keys}  # flood steps answered per second
    loads: list[str] = []
    servers: list[dict] = []  # what the server says about itself (the provenance)
    SENTINEL.unlink(missing_ok=True)
    for repeat in range(args.repeats):
        for mode in modes:
            for fair in fairness:
                key = f"{mode}/{fair}"
                extra = ["--grading-timeout", str(args.grading_timeout), "--grading-fairness", fair,
                         "--shutdown-grace", "1"]  # a flooded server would wait for its whole queue
                with server("ours", None, args.workers, 20_000, extra) as (url, _pid):
                    servers[:] = servers or [server_info(url)]
                    tally, probed = asyncio.run(run(url, mode, args.honest, args.hostile, args.flood_connections,
                                                    args.seconds, args.noise))
                load = Path("/proc/loadavg").read_text().split()[0] if os.path.exists("/proc/loadavg") else "?"
                loads.append(load)
                row = row_of("ours", mode, args.honest, tally)
                rows[key].append(row)
                extra_text = ""
                if probed is not False:
                    assert not isinstance(probed, bool)
                    probes[key].append(probed)
                    extra_text = (f"  probe reward {probed[0]:.0f} in {probed[1]:6.2f} s" if probed is not None
                                  else f"  probe not graded within {PROBE_TIMEOUT_S:.0f} s")
                flood_rate = tally.flood_steps_per_s  # type: ignore[attr-defined]  # set by run()
                flood_rates[key].append(flood_rate)
                print(f"repeat {repeat} {key:17s} {row.steps_per_s:9.1f} steps/s  p50 {row.p50_ms:7.2f} ms  "
                      f"p99 {row.p99_ms:7.2f} ms  errors {row.errors}  flood {flood_rate:7.1f} "
                      f"steps/s{extra_text}  load {load}", flush=True)
                if tally.error_samples:
                    print(f"  errors: {tally.error_samples}", flush=True)
    summary: dict[str, dict] = {}
    for key in keys:
        summary[key] = {
            "steps_per_s": statistics.median(r.steps_per_s for r in rows[key]),
            "p50_ms": statistics.median(r.p50_ms for r in rows[key]),
            "p99_ms": statistics.median(r.p99_ms for r in rows[key]),
            "errors": sum(r.errors for r in rows[key]),
            "flood_steps_per_s": round(statistics.median(flood_rates[key]), 1),
        }
        if probes[key]:  # a probe not graded in time counts as PROBE_TIMEOUT_S (and reward None)
            summary[key]["probe_rewards"] = [p[0] if p else None for p in probes[key]]
            summary[key]["probe_s"] = round(statistics.median(p[1] if p else PROBE_TIMEOUT_S for p in probes[key]), 2)
    print(f"\n{'mode':17s} {'steps/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99/calm':>9s} {'steps/calm':>11s} "
          f"errors  probe")
    for key in keys:
        s, calm = summary[key], summary[f"calm/{key.split('/')[1]}"]
        s["p99_ratio"] = round(s["p99_ms"] / calm["p99_ms"], 2)
        s["steps_ratio"] = round(s["steps_per_s"] / calm["steps_per_s"], 2)
        probe_text = f"{s['probe_rewards']} {s['probe_s']} s" if "probe_s" in s else ""
        print(f"{key:17s} {s['steps_per_s']:9.1f} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['p99_ratio']:9.2f} "
              f"{s['steps_ratio']:11.2f} {s['errors']:6d}  {probe_text}")
    executed = SENTINEL.exists()
    print(f"executed: {executed}  loadavg (1 min) after each run: {' '.join(loads)}")
    print(json.dumps({"honest": args.honest, "hostile": args.hostile, "flood_connections": args.flood_connections,
                      "repeats": args.repeats, "executed": executed, "loadavg_1min": loads, **summary,
                      "provenance": {**provenance(vars(args)), "env_servers": servers}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
