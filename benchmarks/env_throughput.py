"""Env throughput and latency: mathdebate's ``/ws/mux`` against the OpenEnv reference server.

The servers serve the same debate environment (``benchmarks/openenv_reference.py`` wraps
mathdebate's state machine, problems and grading pool in OpenEnv's ``create_app``) as one
uvicorn process each with the same number of grading workers, started fresh by this script on
this machine. The OpenEnv baseline (``openenv010``) is OpenEnv 0.10 (the ``openenv``
distribution, deployed as its documentation's template deploys an environment: ``uvicorn
server.app:app``, one process), in its own cached virtual environment
(``$XDG_CACHE_HOME/mathdebate/openenv010-bench-venv``: ``openenv==0.10.*`` and this project's
server dependencies, built on first use; 0.10 and openenv-core 0.3.0 install the same import
package); ``openenv030`` is the earlier anchor, openenv-core 0.3.0 from this environment. The load generator
(this process) plays whole debates in ``N`` concurrent sessions: reset, solver answer, verifier
accepts, judge answer; an episode counts once graded (ours: the pushed ``rewards`` frame;
OpenEnv: the terminal observation, which carries the reward). Ours spreads the sessions over
``--connections`` WebSockets that batch frames (RFC 0005, as ``MuxClient`` does by default;
``--no-batch`` for plain RFC 0001); OpenEnv has one WebSocket per session, one frame per message.

Workloads:
- ``cached``: built-in problems answered with their reference answer, so every grade is known
  without a grading worker (exact path or verdict cache): transport and session cost.
- ``fresh``: MATH-500 problems answered with a never-seen wrong answer each time, a cube root
  ``\\sqrt[3]{N}`` that no event-loop fast path decides, so every solver and judge turn goes to
  a grading worker: grading cost.

Reported per (server, workload, sessions): steps/s (``step`` requests answered per second in the
measured window, after all sessions are open), episodes/s, p50/p99 step latency, errors.
Memory per idle session: the server's resident memory (``VmRSS``, grading workers excluded)
after opening ``--idle-sessions`` sessions and resetting each, minus before, divided by the count.

Servers and repeats are interleaved: every server of a workload is started first, then each
repeat runs every server in turn; the median of ``--repeats`` is reported.

Usage::

    python benchmarks/env_throughput.py --sessions 1000 --seconds 10
    python benchmarks/env_throughput.py --sessions 1 100 1000 10000 --seconds 10 --workloads cached fresh

Prints a table, then one JSON line: ``ours``/``baseline``/``ratio`` are steps/s at the largest
session count both servers ran on the first workload (ratio = ours / baseline, higher is better;
the baseline is OpenEnv 0.10 when measured, else 0.3.0, named by ``baseline_version``),
``openenv030``/``ratio_vs_openenv030`` the same against 0.3.0 and ``openenv010_vs_030`` how
the anchor moved, plus every measured row and the memory figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from env_server.cli import free_port, wait_healthy  # noqa: E402  after the sys.path insert above
from env_server.debate.problems import load_problem_source  # noqa: E402  after the sys.path insert above
from env_server.protocol.models import MAX_BATCH_FRAMES  # noqa: E402  after the sys.path insert above
from env_server.provenance import provenance, server_info  # noqa: E402  after the sys.path insert above

#: the OpenEnv servers: kind -> (distribution, requirement)
OPENENV = {"openenv010": ("openenv", "openenv==0.10.*"), "openenv030": ("openenv-core", "openenv-core==0.3.0")}
OPENENV010_VENV = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mathdebate"
                   / "openenv010-bench-venv")

MATH500 = REPO.parent / "shared" / "data" / "math500.jsonl"
OPEN_CONCURRENCY = 256  # connections/sessions being opened at once (both servers)


# --------------------------------------------------------------------------- servers


def server_requirements() -> list[str]:
    """This project's server dependencies, as ``pyproject.toml`` lists them."""
    import tomllib

    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def openenv010_python() -> str:
    """The Python of the cached OpenEnv 0.10 environment (module docstring), created on first use
    and again when the requirements change (a marker file lists them).

    Raises:
        subprocess.CalledProcessError: ``venv`` or ``pip`` failed (e.g. no package index).
    """
    requirements = [OPENENV["openenv010"][1], *server_requirements()]
    marker = OPENENV010_VENV / "mathdebate-requirements.txt"
    python = OPENENV010_VENV / "bin" / "python"
    if not (marker.exists() and marker.read_text() == "\n".join(requirements) and python.exists()):
        print(f"  (creating {OPENENV010_VENV}: {' '.join(requirements)})", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(OPENENV010_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                       check=True, timeout=1200)
        marker.write_text("\n".join(requirements))
    return str(python)


def openenv_version(kind: str) -> str:
    """The installed version of the OpenEnv distribution an ``openenv*`` server kind runs."""
    python = openenv010_python() if kind == "openenv010" else sys.executable
    code = f"import importlib.metadata as m; print(m.version({OPENENV[kind][0]!r}))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


#: ``--compiled-site``: a directory holding a compiled install of mathdebate (``setup.py``,
#: ``MATHDEBATE_MYPYC=1``), imported first by our servers; empty: the checkout's pure Python
COMPILED_SITE = [""]


@contextmanager
def server(kind: str, problems: str | None, workers: int, max_sessions: int, extra: Sequence[str] = ()):
    """Start one server process; yield ``(http_url, pid)``; stop it with SIGTERM.

    ``kind``: ``ours``, ``journal`` (ours with ``--state-dir`` in a fresh temporary directory:
    the cost of journaling), ``openenv010`` or ``openenv030`` (``OPENENV``); ``extra``: more
    ``serve`` arguments (ours)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if kind in ("ours", "journal"):
        if COMPILED_SITE[0]:  # our servers import the compiled install first (--compiled-site)
            env["PYTHONPATH"] = os.pathsep.join((COMPILED_SITE[0], str(REPO)))
        cmd = [sys.executable, "-m", "env_server.cli", "serve", "--port", str(port), "--log-level", "warning",
               "--grading-workers", str(workers), "--max-sessions", str(max_sessions),
               "--max-sessions-per-connection", str(max_sessions), *extra]
        if kind == "journal":
            cmd += ["--state-dir", tempfile.mkdtemp(prefix="bench-state-")]
        if problems:
            cmd += ["--problems", problems]
    else:
        env.update(MATHDEBATE_REF_PROBLEMS=problems or "", MATHDEBATE_REF_WORKERS=str(workers),
                   MATHDEBATE_REF_MAX_ENVS=str(max_sessions))
        python = openenv010_python() if kind == "openenv010" else sys.executable
        cmd = [python, "-m", "uvicorn", "benchmarks.openenv_reference:app", "--port", str(port),
               "--log-level", "warning"]
    log = tempfile.NamedTemporaryFile(prefix=f"bench-{kind}-", suffix=".log", delete=False)  # noqa: SIM115  the server subprocess writes it until stop
    # ``python -m`` puts its working directory first on the path: a compiled site's servers start in it
    cwd = COMPILED_SITE[0] if kind in ("ours", "journal") and COMPILED_SITE[0] else REPO
    process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=120, process=process)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        print(f"  ({kind} server log: {log.name})", file=sys.stderr)


def _children(pid: int) -> list[int]:
    """The child pids of every thread of ``pid`` (Linux ``/proc/<pid>/task/<tid>/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(x) for x in task.read_text().split()]
        except OSError:
            continue
    return found


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its descendants (the grading
    workers), Linux ``/proc``: each living process's own time and that of its children it has
    reaped (``cutime``, ``cstime``), so a worker replaced in between (pebble restarts one after a
    timeout) still counts, through the process that waited for it. Why: with the load generator
    on the same cores, steps/s is bounded by client and server together; CPU per step measures
    the server alone."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime (fields 14-17 of stat)
        total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / ticks
        todo += _children(current)
    return total


def rss_kb(pid: int) -> int:
    """Resident set size of one process, KiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    """What the sessions answer: ``next_episode()`` -> (problem_id, solver text, judge text)."""

    name: str
    problems: str | None
    next_episode: Callable[[], tuple[str, str, str]]
    think_s: float = 0.0  # mean pause after each reply (a policy generating its next turn)

    async def think(self) -> None:
        if self.think_s:
            await asyncio.sleep(random.uniform(0.5, 1.5) * self.think_s)


def make_workload(name: str) -> Workload:
    if name == "cached":
        source = load_problem_source(None)
        episodes = [(p.problem_id, p.answer) for p in (source.by_seed(i) for i in range(64))]
        cycle = itertools.cycle(episodes)

        def cached() -> tuple[str, str, str]:
            problem_id, answer = next(cycle)
            text = f"The answer is \\boxed{{{answer}}}."
            return problem_id, text, text

        return Workload(name, None, cached)
    if name == "fresh":
        source = load_problem_source(str(MATH500))
        ids = itertools.cycle([source.by_seed(i).problem_id for i in range(500)])
        counter = itertools.count(1_000_003)

        def fresh() -> tuple[str, str, str]:
            return (next(ids), f"So \\boxed{{\\sqrt[3]{{{next(counter)}}}}}.",
                    f"Final: \\boxed{{\\sqrt[3]{{{next(counter)}}}}}.")

        return Workload(name, str(MATH500), fresh)
    raise ValueError(f"unknown workload {name!r}")


VERDICT = "The derivation holds. VERDICT: CORRECT"


@dataclass
class Tally:
    """Counts and latencies inside the measured window."""

    measuring: bool = False
    steps: int = 0
    episodes: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)
    #: the servers' process trees (their pids), whose CPU time the window measures
    server_pids: list[int] = field(default_factory=list)
    #: CPU seconds the servers' process trees (grading workers included) and this load generator
    #: used inside the window
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def step_done(self, seconds: float) -> None:
        if self.measuring:
            self.steps += 1
            self.latencies_ms.append(seconds * 1000)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(what[:200])


# --------------------------------------------------------------------------- ours: /ws/mux


class MuxConnection:
    """A minimal /ws/mux client (raw frames, RFC 0001): request ids -> futures, pushed
    ``rewards`` frames -> per-session futures. Kept as lean as the OpenEnv loop below so the
    load generator costs both servers alike.

    With ``batch`` (RFC 0005, ``?batch=1``) every frame requested during one event-loop
    iteration goes out in one array message, and server messages are arrays: the way
    ``env_server.client.MuxClient`` talks to the server by default."""

    def __init__(self, ws: ClientConnection, batch: bool = False) -> None:
        self.ws = ws
        self.batch = batch
        self.ids = itertools.count()
        self.pending: dict[int, asyncio.Future] = {}
        self.rewards: dict[str, asyncio.Future] = {}
        self.outbox: list[bytes] = []
        self.sends: set[asyncio.Future[None]] = set()  # batched sends in flight (the loop keeps only weak references)
        self.reader = asyncio.create_task(self._read())

    def _on_frame(self, frame: dict) -> None:
        request_id = frame.get("request_id")
        if request_id is None:
            if frame["type"] == "rewards":
                waiter = self.rewards.pop(frame["session_id"], None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(frame)
            return
        future = self.pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(frame)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                message = orjson.loads(raw)
                if isinstance(message, list):
                    for frame in message:
                        self._on_frame(frame)
                else:
                    self._on_frame(message)
        except Exception as exc:  # connection lost: fail every waiter
            for future in [*self.pending.values(), *self.rewards.values()]:
                if not future.done():
                    future.set_exception(ConnectionError(str(exc)))

    def _flush(self) -> None:
        if not self.outbox:
            return
        frames, self.outbox = self.outbox, []
        send = asyncio.ensure_future(self.ws.send((b"[" + b",".join(frames) + b"]").decode()))
        self.sends.add(send)
        send.add_done_callback(self.sends.discard)

    async def request(self, type_: str, session_id: str | None = None, data: Any = None) -> dict:
        request_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        frame: dict[str, Any] = {"type": type_, "request_id": request_id}
        if session_id is not None:
            frame["session_id"] = session_id
        if data is not None:
            frame["data"] = data
        if self.batch:
            if not self.outbox:
                asyncio.get_running_loop().call_soon(self._flush)
            self.outbox.append(orjson.dumps(frame))
            if len(self.outbox) >= MAX_BATCH_FRAMES:
                self._flush()
        else:
            await self.ws.send(orjson.dumps(frame).decode())
        return await future


async def mux_session(conn: MuxConnection, workload: Workload, tally: Tally, opened: asyncio.Event,
                      go: asyncio.Event, stop: asyncio.Event, ready: list[int]) -> None:
    reply = await conn.request("open")
    session_id = reply["session_id"]
    ready[0] += 1
    if ready[0] == ready[1]:
        opened.set()
    await go.wait()
    while not stop.is_set():
        problem_id, solver, judge = workload.next_episode()
        reply = await conn.request("reset", session_id, {"problem_id": problem_id})
        if reply["type"] != "observation":
            tally.error(str(reply))
            continue
        graded = asyncio.get_running_loop().create_future()
        conn.rewards[session_id] = graded
        ok = True
        for role, content in (("solver", solver), ("verifier", VERDICT), ("judge", judge)):
            start = time.perf_counter()
            reply = await conn.request("step", session_id, {"role": role, "content": content})
            if reply["type"] != "observation":
                tally.error(str(reply))
                ok = False
                break
            tally.step_done(time.perf_counter() - start)
            if reply["data"]["done"]:
                break
            await workload.think()
        if ok:
            await graded
            if tally.measuring:
                tally.episodes += 1
        else:
            conn.rewards.pop(session_id, None)


async def run_ours(url: str | list[str], sessions: int, connections: int, workload: Workload, seconds: float,
                   batch: bool = True, pids: Sequence[int] = ()) -> Tally:
    """Play ``sessions`` sessions over ``connections`` connections; with several URLs
    (replicas) the connections go round-robin over them, at least one per replica. ``pids``:
    the servers' processes, whose CPU time in the window the tally records."""
    urls = [url] if isinstance(url, str) else url
    ws_urls = [u.replace("http", "ws") + "/ws/mux" + ("?batch=1" if batch else "") for u in urls]
    count = max(min(connections, sessions), len(urls))
    conns = [MuxConnection(await connect(ws_urls[i % len(ws_urls)], max_size=None, compression=None, open_timeout=60,
                                         ping_interval=None), batch) for i in range(count)]
    tally, opened, go, stop = Tally(server_pids=list(pids)), asyncio.Event(), asyncio.Event(), asyncio.Event()
    ready = [0, sessions]
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)

    async def one(i: int) -> None:
        async with gate:
            pass
        await mux_session(conns[i % len(conns)], workload, tally, opened, go, stop, ready)

    tasks = [asyncio.create_task(one(i)) for i in range(sessions)]
    await measure(tally, opened, go, stop, seconds, tasks)
    for conn in conns:
        await conn.ws.close()
        conn.reader.cancel()
    return tally


# --------------------------------------------------------------------------- OpenEnv: /ws


async def openenv_session(url: str, workload: Workload, tally: Tally, opened: asyncio.Event, go: asyncio.Event,
                          stop: asyncio.Event, ready: list[int], gate: asyncio.Semaphore) -> None:
    async with gate:
        ws = await connect(url.replace("http", "ws") + "/ws", max_size=None, compression=None, open_timeout=120,
                           ping_interval=None)
        # the session (and its Environment) exists after the first message: reset once to open it
        problem_id, _, _ = workload.next_episode()
        await ws.send(orjson.dumps({"type": "reset", "data": {"problem_id": problem_id}}).decode())
        first = orjson.loads(await ws.recv())
    ready[0] += 1
    if ready[0] == ready[1]:
        opened.set()
    if first["type"] != "observation":
        tally.error(str(first))
        await ws.close()
        return
    await go.wait()
    try:
        while not stop.is_set():
            problem_id, solver, judge = workload.next_episode()
            await ws.send(orjson.dumps({"type": "reset", "data": {"problem_id": problem_id}}).decode())
            reply = orjson.loads(await ws.recv())
            if reply["type"] != "observation":
                tally.error(str(reply))
                continue
            for role, content in (("solver", solver), ("verifier", VERDICT), ("judge", judge)):
                start = time.perf_counter()
                await ws.send(orjson.dumps({"type": "step", "data": {"role": role, "content": content}}).decode())
                reply = orjson.loads(await ws.recv())
                if reply["type"] != "observation":
                    tally.error(str(reply))
                    break
                tally.step_done(time.perf_counter() - start)
                if reply["data"]["done"]:
                    if tally.measuring:
                        tally.episodes += 1
                    break
                await workload.think()
    finally:
        await ws.close()


async def run_openenv(url: str, sessions: int, workload: Workload, seconds: float, pids: Sequence[int] = ()) -> Tally:
    """Play ``sessions`` OpenEnv sessions, one WebSocket each; ``pids`` as for :func:`run_ours`."""
    tally, opened, go, stop = Tally(server_pids=list(pids)), asyncio.Event(), asyncio.Event(), asyncio.Event()
    ready = [0, sessions]
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    tasks = [asyncio.create_task(openenv_session(url, workload, tally, opened, go, stop, ready, gate))
             for _ in range(sessions)]
    await measure(tally, opened, go, stop, seconds, tasks)
    return tally


# --------------------------------------------------------------------------- measuring


async def measure(tally: Tally, opened: asyncio.Event, go: asyncio.Event, stop: asyncio.Event, seconds: float,
                  tasks: list[asyncio.Task]) -> None:
    """Open every session, warm up briefly, count inside a ``seconds`` window, then stop."""
    waiter = asyncio.create_task(opened.wait())
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED, timeout=600)
    if waiter not in done:
        failed = [t for t in done if t is not waiter and t.exception() is not None]
        if failed:
            tally.error(f"session failed while opening: {failed[0].exception()!r}")
        elif not done:
            tally.error("sessions did not open within 600 s")
        await asyncio.wait_for(opened.wait(), timeout=600) if not failed else None
    go.set()
    await asyncio.sleep(min(2.0, seconds / 4))  # warm-up, not counted
    server_cpu = sum(tree_cpu_s(pid) for pid in tally.server_pids)
    client_cpu = sum(os.times()[:2])
    tally.measuring = True
    tally.window_start = time.perf_counter()  # type: ignore[attr-defined]  # ad-hoc timing field
    await asyncio.sleep(seconds)
    tally.measuring = False
    tally.window = time.perf_counter() - tally.window_start  # type: ignore[attr-defined]  # ad-hoc timing field
    tally.server_cpu_s = sum(tree_cpu_s(pid) for pid in tally.server_pids) - server_cpu
    tally.client_cpu_s = sum(os.times()[:2]) - client_cpu
    stop.set()
    _, pending = await asyncio.wait(tasks, timeout=60)
    for task in pending:
        task.cancel()
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            tally.error(repr(task.exception()))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Row:
    server: str
    workload: str
    sessions: int
    steps_per_s: float
    episodes_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    #: the server's CPU time (all its processes) per step in the window, microseconds
    server_cpu_us_per_step: float | None = None
    #: the load generator's CPU time per step in the window, microseconds
    client_cpu_us_per_step: float | None = None


def row_of(server_name: str, workload: str, sessions: int, tally: Tally) -> Row:
    window = getattr(tally, "window", 1.0)

    def per_step(cpu_s: float) -> float | None:
        return round(cpu_s / tally.steps * 1e6, 1) if tally.steps else None

    return Row(server_name, workload, sessions, round(tally.steps / window, 1), round(tally.episodes / window, 1),
               round(percentile(tally.latencies_ms, 0.5), 2), round(percentile(tally.latencies_ms, 0.99), 2),
               tally.errors, per_step(tally.server_cpu_s) if tally.server_pids else None, per_step(tally.client_cpu_s))


async def idle_memory(url: str, pid: int, kind: str, count: int, connections: int) -> float:
    """KiB of server RSS per idle session (opened and reset, then left alone)."""
    workload = make_workload("cached")
    await asyncio.sleep(1.0)
    before = rss_kb(pid)
    keep: list[Any] = []
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    if kind == "ours":
        ws_url = url.replace("http", "ws") + "/ws/mux"
        conns = [MuxConnection(await connect(ws_url, max_size=None, compression=None, ping_interval=None))
                 for _ in range(connections)]

        async def one(i: int) -> None:
            async with gate:
                conn = conns[i % len(conns)]
                session_id = (await conn.request("open"))["session_id"]
                await conn.request("reset", session_id, {"problem_id": workload.next_episode()[0]})

        await asyncio.gather(*(one(i) for i in range(count)))
        keep = conns
    else:
        async def one(i: int) -> None:
            async with gate:
                ws = await connect(url.replace("http", "ws") + "/ws", max_size=None, compression=None,
                                   ping_interval=None, open_timeout=120)
                await ws.send(orjson.dumps({"type": "reset", "data": {"problem_id": workload.next_episode()[0]}}).decode())
                await ws.recv()
                keep.append(ws)

        await asyncio.gather(*(one(i) for i in range(count)))
    await asyncio.sleep(1.0)
    after = rss_kb(pid)
    for item in keep:
        ws = item.ws if isinstance(item, MuxConnection) else item
        await ws.close()
    return (after - before) / count


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per row")
    parser.add_argument("--workloads", nargs="+", choices=["cached", "fresh"], default=["cached", "fresh"])
    parser.add_argument("--connections", type=int, default=4, help="our WebSocket connections")
    parser.add_argument("--servers", nargs="+", choices=["ours", "journal", *OPENENV],
                        default=["ours", *OPENENV],
                        help="journal: ours with --state-dir (the journal's cost, beside ours); openenv010: OpenEnv "
                             "0.10 (the baseline); openenv030: openenv-core 0.3.0 (the earlier anchor)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="our servers (replicas) started; connections spread over them round-robin")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra argument for our `mathdebate serve` (repeatable), e.g. --serve-arg=--max-rounds=1")
    parser.add_argument("--baseline-max-sessions", type=int, default=10_000,
                        help="skip the OpenEnv baseline above this many sessions")
    parser.add_argument("--grading-workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--idle-sessions", type=int, default=1000, help="0 skips the memory measurement")
    parser.add_argument("--think-ms", type=float, default=0.0,
                        help="mean pause of each session after each reply (0: closed loop, as fast as possible); "
                             "with many sessions this holds them open at a steady offered load")
    parser.add_argument("--repeats", type=int, default=1, help="runs per row; the median is reported")
    parser.add_argument("--no-batch", action="store_true", help="our connections send one frame per message")
    parser.add_argument("--compiled-site", default="",
                        help="a directory with a compiled install of mathdebate (setup.py, MATHDEBATE_MYPYC=1: "
                             "pip install --no-deps --target DIR WHEEL) that our servers import first; the "
                             "OpenEnv reference servers stay as their deployment runs them")
    args = parser.parse_args(argv)
    COMPILED_SITE[0] = str(Path(args.compiled_site).resolve()) if args.compiled_site else ""

    rows: list[Row] = []
    memory: dict[str, float] = {}
    servers: list[dict[str, Any]] = []  # what our servers say about themselves (the provenance)
    versions = {kind: openenv_version(kind) for kind in args.servers if kind in OPENENV}
    # closed sessions linger for the resume window (ours): room for every session of a run
    max_sessions = sum(args.sessions) * args.repeats + args.idle_sessions + 100
    cpu_per_step: dict[tuple[str, str, int], float] = {}  # (server, workload, sessions) -> median us
    for workload_name in args.workloads:
        workload = make_workload(workload_name)
        workload.think_s = args.think_ms / 1000
        with ExitStack() as stack:
            started: dict[str, list[tuple[str, int]]] = {}
            for server_name in args.servers:  # all started first, so that the repeats interleave
                replicas = 1 if server_name in OPENENV else args.replicas
                started[server_name] = [stack.enter_context(server(server_name, workload.problems, args.grading_workers,
                                                                   max_sessions, args.serve_arg))
                                        for _ in range(replicas)]
                url, pid = started[server_name][0]
                if server_name not in OPENENV and not servers:
                    servers.append(server_info(url))
                if workload_name == args.workloads[0] and args.idle_sessions:
                    memory[server_name] = round(asyncio.run(
                        idle_memory(url, pid, server_name, args.idle_sessions, args.connections)), 2)
            for sessions in args.sessions:
                names = [n for n in args.servers if not (n in OPENENV and sessions > args.baseline_max_sessions)]
                runs: dict[str, list[Row]] = {n: [] for n in names}
                for _ in range(args.repeats):
                    for server_name in names:
                        urls = [u for u, _ in started[server_name]]
                        pids = [pid for _, pid in started[server_name]]
                        if server_name not in OPENENV:
                            tally = asyncio.run(run_ours(urls, sessions, args.connections, workload, args.seconds,
                                                         batch=not args.no_batch, pids=pids))
                        else:
                            tally = asyncio.run(run_openenv(urls[0], sessions, workload, args.seconds, pids=pids))
                        runs[server_name].append(row_of(server_name, workload_name, sessions, tally))
                        if tally.error_samples:
                            print(f"  errors ({server_name}, {workload_name}, {sessions}): {tally.error_samples}",
                                  file=sys.stderr)
                for server_name in names:
                    row = sorted(runs[server_name], key=lambda r: r.steps_per_s)[len(runs[server_name]) // 2]
                    rows.append(row)
                    costs = sorted(r.server_cpu_us_per_step for r in runs[server_name]
                                   if r.server_cpu_us_per_step is not None)
                    if costs:
                        cpu_per_step[(server_name, workload_name, sessions)] = costs[len(costs) // 2]
                        print(f"{server_name:10} {workload_name:7} {sessions:6d} sessions: server CPU per step "
                              f"{costs[len(costs) // 2]:.1f} us (median; runs "
                              f"{' '.join(f'{r.server_cpu_us_per_step:.1f}' for r in runs[server_name])}), load "
                              f"generator {' '.join(f'{r.client_cpu_us_per_step:.1f}' for r in runs[server_name])} us",
                              flush=True)
                    replicas = len(started[server_name])
                    served = row.steps_per_s * args.seconds
                    success = served / (served + row.errors) if served + row.errors else 0.0
                    print(f"{row.server:10} {row.workload:7} {row.sessions:6d} sessions: {row.steps_per_s:9.1f} steps/s "
                          f"p50 {row.p50_ms:8.2f} ms  p99 {row.p99_ms:8.2f} ms  errors {row.errors}  "
                          f"success {success:.4f}  replicas {replicas}  "
                          f"sessions/core {row.sessions / min(os.cpu_count() or 1, replicas):.0f}  "
                          f"runs {' '.join(f'{r.steps_per_s:.0f}' for r in runs[server_name])}", flush=True)

    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"grading workers {args.grading_workers}; our connections {args.connections} "
          f"({'one frame per message' if args.no_batch else 'batched'}); window {args.seconds:.0f} s; "
          f"think {args.think_ms:g} ms")
    baseline_kind = "openenv010" if "openenv010" in args.servers else "openenv030"
    base_name = f"OpenEnv {versions.get(baseline_kind, '?')}"
    print(f"| workload | sessions | ours steps/s | {base_name} steps/s | ratio | ours episodes/s | {base_name} "
          f"episodes/s | ours p50/p99 ms | {base_name} p50/p99 ms | openenv-core 0.3.0 steps/s | ours / 0.3.0 "
          f"| {base_name} / 0.3.0 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary: dict[str, Any] = {}

    def find(kind: str, workload_name: str, sessions: int) -> Row | None:
        return next((r for r in rows if r.server == kind and r.workload == workload_name and r.sessions == sessions), None)

    def over(a: Row | None, b: Row | None) -> float | None:
        return round(a.steps_per_s / b.steps_per_s, 2) if a and b and b.steps_per_s else None

    for workload_name, sessions in itertools.product(args.workloads, args.sessions):
        ours = find("ours", workload_name, sessions)
        base = find(baseline_kind, workload_name, sessions)
        old = find("openenv030", workload_name, sessions) if baseline_kind != "openenv030" else None
        ratio = over(ours, base)
        fmt = lambda r: f"{r.steps_per_s:.0f}" if r else "-"  # noqa: E731  one-line table formatters
        lat = lambda r: f"{r.p50_ms:.1f} / {r.p99_ms:.1f}" if r else "-"  # noqa: E731  one-line table formatters
        eps = lambda r: f"{r.episodes_per_s:.0f}" if r else "-"  # noqa: E731  one-line table formatters
        print(f"| {workload_name} | {sessions} | {fmt(ours)} | {fmt(base)} | {ratio if ratio else '-'} "
              f"| {eps(ours)} | {eps(base)} | {lat(ours)} | {lat(base)} | {fmt(old)} | {over(ours, old) or '-'} "
              f"| {over(base, old) or '-'} |")
        if ours and base and workload_name == args.workloads[0]:
            summary = {"ours": ours.steps_per_s, "baseline": base.steps_per_s, "ratio": ratio, "sessions": sessions,
                       "workload": workload_name, "baseline_version": versions.get(baseline_kind)}
            if old:
                summary.update(openenv030=old.steps_per_s, ratio_vs_openenv030=over(ours, old),
                               openenv010_vs_030=over(base, old), openenv030_version=versions.get("openenv030"))
            ours_cpu = cpu_per_step.get(("ours", workload_name, sessions))
            base_cpu = cpu_per_step.get((baseline_kind, workload_name, sessions))
            if ours_cpu and base_cpu:
                summary.update(server_cpu_us_per_step={"ours": ours_cpu, "baseline": base_cpu},
                               server_cpu_ratio=round(base_cpu / ours_cpu, 2))
        ours_cpu = cpu_per_step.get(("ours", workload_name, sessions))
        base_cpu = cpu_per_step.get((baseline_kind, workload_name, sessions))
        if ours_cpu and base_cpu:
            print(f"server CPU per step ({workload_name}, {sessions} sessions; medians): ours {ours_cpu:.1f} us, "
                  f"{base_name} {base_cpu:.1f} us: {base_name} / ours = {base_cpu / ours_cpu:.2f}")
    if memory:
        print(f"memory per idle session ({args.idle_sessions} sessions): "
              + ", ".join(f"{k} {v:.1f} KiB" for k, v in memory.items()))
    ours_rows = {(r.workload, r.sessions): r for r in rows if r.server == "ours"}
    for r in rows:
        if r.server == "journal" and (r.workload, r.sessions) in ours_rows:
            base = ours_rows[(r.workload, r.sessions)]
            print(f"journal cost ({r.workload}, {r.sessions} sessions): {r.steps_per_s:.0f} vs {base.steps_per_s:.0f} "
                  f"steps/s memory-only = {r.steps_per_s / base.steps_per_s:.2f}x")
    result = {**summary, "openenv_versions": versions,
              "replicas": args.replicas, "unit": "steps/s", "think_ms": args.think_ms, "batched": not args.no_batch,
              "memory_kib_per_idle_session": memory, "rows": [asdict(r) for r in rows],
              "provenance": {**provenance(vars(args)), "env_servers": servers}}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
