"""Scale-out over env replicas (issue 16): client-side placement, re-placement when a replica
dies, and the trainer's environment surviving a server restart with and without state.

Real servers in subprocesses on real sockets: three replicas for placement, one restarted on
the same port for the trainer's environment.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from reliability_helpers import killable_server

from env_server.cli import free_port, wait_healthy
from env_server.client import MuxClient, SessionLostError
from env_server.client.play import play
from env_server.client.replicas import NoReplicaError, ReplicaPool, parse_urls
from env_server.debate.problems import ProblemGenerator
from trainer_client.rollout.environment import environment_factory, shared_client
from trainer_client.rollout.tools import DEBATE_OVER

GENERATOR = ProblemGenerator()


def server(port: int, *extra: str):
    """``mathdebate serve`` on ``port`` (one grading worker); SIGKILLed on exit if alive."""
    return killable_server(port, *extra)


def _start_replicas(n: int) -> tuple[list[str], list[subprocess.Popen[bytes]]] | None:
    """``n`` servers on free ports, healthy; ``None`` (all stopped) when one of them lost its
    port to another process between ``free_port`` and its bind: the URL would then answer from
    that other process, and killing ours would test nothing."""
    ports = [free_port() for _ in range(n)]
    processes = [subprocess.Popen([sys.executable, "-m", "env_server.cli", "serve", "--port", str(port),
                                   "--log-level", "warning", "--grading-workers", "1"]) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url, process in zip(urls, processes, strict=True):  # they start in parallel
            wait_healthy(url, process=process)
        time.sleep(0.5)  # a server that failed to bind exits just after its port answered for another
        if all(process.poll() is None for process in processes):
            return urls, processes
    except RuntimeError:
        pass
    _stop(processes)
    return None


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)


@pytest.fixture
def three_replicas() -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    for _ in range(3):  # a port taken by another process on a shared machine: new ports
        started = _start_replicas(3)
        if started is not None:
            break
    else:
        pytest.fail("three env servers could not start on free ports in 3 tries")
    urls, processes = started
    try:
        yield urls, processes
    finally:
        _stop(processes)


def test_parse_urls() -> None:
    assert parse_urls("http://a:1, http://b:2,") == ["http://a:1", "http://b:2"]
    assert parse_urls(["http://a:1"]) == ["http://a:1"]
    with pytest.raises(ValueError):
        parse_urls(" , ")


def test_sessions_go_to_the_least_loaded_replica_and_play_spreads_over_all(three_replicas) -> None:
    urls, _ = three_replicas

    async def placement() -> None:
        async with ReplicaPool(",".join(urls)) as pool:
            sessions = [await pool.open_session() for _ in range(7)]
            assert pool.load() == [3, 2, 2]  # least-loaded first, ties to the earliest
            assert [pool.replica_of(s) for s in sessions[:3]] == urls
            await sessions[1].close()  # on urls[1]
            await sessions[2].close()  # on urls[2]
            assert pool.load() == [3, 1, 1]
            assert pool.replica_of(await pool.open_session()) == urls[1]
            assert pool.replica_of(await pool.open_session()) == urls[2]
        async with ReplicaPool(",".join(urls)) as pool:  # opens awaiting their reply count as load
            await asyncio.gather(*(pool.open_session() for _ in range(9)))
            assert pool.load() == [3, 3, 3]

    asyncio.run(placement())
    out = subprocess.run([sys.executable, "-m", "env_server.cli", "play", "--url", ",".join(urls), "--episodes", "60",
                          "--concurrency", "12", "--policy", "reference", "--json", "--no-progress"],
                         capture_output=True, text=True, timeout=120, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 60 and summary["failed"] == 0 and summary["accuracy"] == 1.0
    assert set(summary["per_replica"]) == set(urls) and all(n >= 5 for n in summary["per_replica"].values())


def test_a_replica_killed_mid_run_its_sessions_move_to_the_others(three_replicas) -> None:
    """SIGKILL one of three replicas in the middle of a run: new sessions go to the two left,
    the episodes that were on the dead one are played again elsewhere after the reconnect
    budget (counted), and every episode is graded exactly once.

    The replica is frozen (SIGSTOP) before the kill, so that each of its sessions is caught
    waiting for a reply (play keeps a session across episodes, so one always is): a kill
    that lands while they are between episodes would leave nothing to replay."""
    urls, processes = three_replicas

    async def run() -> None:
        task = asyncio.ensure_future(play(",".join(urls), GENERATOR, episodes=3000, concurrency=30, policy="reference",
                                          progress=False, rerun_after_s=1.0))
        while (await asyncio.to_thread(_stats, urls[1]))["episodes_graded"] < 100:  # in full swing
            await asyncio.sleep(0.02)
        processes[1].send_signal(signal.SIGSTOP)
        await asyncio.sleep(0.3)
        processes[1].send_signal(signal.SIGKILL)
        report = await asyncio.wait_for(task, 120)
        assert report.episodes == 3000 and report.failed == 0, report.errors
        assert report.reruns >= 1  # sessions were mid-episode on the killed replica
        assert report.episodes == sum(report.per_replica.values())
        assert report.per_replica[urls[0]] > 0 and report.per_replica[urls[2]] > 0

    asyncio.run(run())


def _stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as response:
        return json.loads(response.read())


def test_no_replica_reachable_is_a_clear_error() -> None:
    async def run() -> None:
        async with ReplicaPool([f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]) as pool:
            with pytest.raises(NoReplicaError, match="no env replica accepted a session"):
                await pool.open_session()

    asyncio.run(run())


def _play_two_turns(env, problem) -> None:
    env.reset(problem_id=problem.problem_id)
    env.submit_solution(rf"\boxed{{{problem.answer}}}")


@pytest.mark.parametrize("with_state", [True, False], ids=["state-dir", "no-state"])
def test_trainer_environment_survives_a_server_restart(tmp_path: Path, with_state: bool) -> None:
    """The server is killed mid-debate and restarted on the same port. With ``--state-dir`` the
    environment's connection re-attaches and the same episode continues (no replay); without,
    the session is gone and the episode is replayed on the same problem with the same actions
    (counted). Either way the rollout's reward is the right one and its trace is whole."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    extra = ("--state-dir", str(tmp_path / "state")) if with_state else ()
    problem = GENERATOR.by_seed(21)
    env = environment_factory(url, rerun_after_s=60)()
    pool = shared_client(url)
    with ExitStack() as stack:
        first = stack.enter_context(server(port, *extra))
        _play_two_turns(env, problem)
        episode_id = env.trace.observation.episode_id
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    with server(port, *extra):
        text = env.submit_verdict("CORRECT", "checked")  # waits for the reconnect
        assert text.startswith("[JUDGE]")
        assert env.submit_final_answer(problem.answer) == DEBATE_OVER
        assert env.get_reward() == 1.0
        assert [t.t for t in env.trace.turns] == [0, 1, 2]
        if with_state:
            assert pool.reruns == 0 and env.trace.record.episode_id == episode_id
        else:
            assert pool.reruns == 1 and env.trace.record.episode_id != episode_id
            assert env.trace.record.problem_id == problem.problem_id


def test_in_flight_requests_survive_a_dropped_connection(tmp_path: Path) -> None:
    """The TCP connection is cut with steps in flight: the client reconnects, re-attaches and
    re-sends them with their ``t``; each acts once (the server's step count says so)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    async def run() -> None:
        async with MuxClient(url) as client:
            sessions = [await client.open_session() for _ in range(20)]
            problems = [GENERATOR.by_seed(300 + i) for i in range(20)]
            await asyncio.gather(*(s.reset(problem_id=p.problem_id) for s, p in zip(sessions, problems, strict=True)))
            steps = [asyncio.ensure_future(s.step("solver", rf"\boxed{{{p.answer}}}"))
                     for s, p in zip(sessions, problems, strict=True)]
            await asyncio.sleep(0)
            await client.drop(reconnect=True)  # cut: no close frame; the client reconnects itself
            results = await asyncio.wait_for(asyncio.gather(*steps), 30)
            assert all(r.observation.t == 1 and r.observation.role == "verifier" for r in results)
            states = await asyncio.gather(*(s.state() for s in sessions))
            assert all(state["step_count"] == 1 for state in states)
            assert client.reconnects == 1

    with server(port):
        asyncio.run(run())


def test_a_reattach_refused_for_capacity_loses_that_session_only(tmp_path: Path) -> None:
    """The server comes back (same state) with a per-connection limit of 1: of the two sessions
    the client re-attaches, one is refused with ``CAPACITY_REACHED``. That session is lost
    (``SessionLostError``, so a caller reruns its episode) and the other goes on; the
    reconnect does not die on the refusal, leaving every waiting request hanging."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = ("--state-dir", str(tmp_path / "state"))
    problems = [GENERATOR.by_seed(400 + i) for i in range(2)]

    async def run(restart) -> None:
        async with MuxClient(url, reconnect_budget_s=60) as client:
            sessions = [await client.open_session() for _ in problems]
            await asyncio.gather(*(s.reset(problem_id=p.problem_id) for s, p in zip(sessions, problems, strict=True)))
            await asyncio.to_thread(restart)
            outcomes = await asyncio.wait_for(asyncio.gather(
                *(s.step("solver", rf"\boxed{{{p.answer}}}") for s, p in zip(sessions, problems, strict=True)),
                return_exceptions=True), 30)
            lost = [o for o in outcomes if isinstance(o, SessionLostError)]
            stepped = [o for o in outcomes if not isinstance(o, BaseException)]
            assert len(lost) == 1 and lost[0].code == "CAPACITY_REACHED", outcomes
            assert len(stepped) == 1 and stepped[0].observation.role == "verifier"

    with ExitStack() as stack:
        first = stack.enter_context(server(port, *state))

        def restart() -> None:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            stack.enter_context(server(port, *state, "--max-sessions-per-connection", "1"))

        asyncio.run(run(restart))


def test_a_reconnect_gives_up_within_its_budget_on_a_server_that_never_answers() -> None:
    """A server that takes the new connection but never answers the re-attach (hung, or a
    proxy with no backend): the waiting request fails with ``ConnectionError`` once the
    reconnect budget is spent, not after the much longer request timeout."""
    from websockets.asyncio.server import serve

    connections = 0

    async def handler(ws) -> None:
        nonlocal connections
        connections += 1
        if connections > 1:  # the reconnect: never answered
            await ws.wait_closed()
            return
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] == "open":
                await ws.send(json.dumps({"type": "opened", "request_id": frame["request_id"], "session_id": "s",
                                          "data": {"session_id": "s", "resume_token": "r", "resume_window_s": 60}}))
            else:  # the step: the connection is cut instead of answered
                ws.transport.abort()
                return

    async def run() -> None:
        async with serve(handler, "127.0.0.1", 0) as hung:
            port = hung.sockets[0].getsockname()[1]
            client = MuxClient(f"http://127.0.0.1:{port}", batch=False, request_timeout_s=60, reconnect_budget_s=1.0)
            session = await client.open_session()
            loop = asyncio.get_running_loop()
            start = loop.time()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(session.step("solver", "x"), 20)
            assert loop.time() - start < 5 and connections >= 2
            await client.close()

    asyncio.run(run())


class _CutAfterReattach(MuxClient):
    """Cuts its new connection once, right after the reconnect's re-attach is answered and
    before the reconnect finishes: the race in which the read loop leaves recovery to the
    reconnect still in progress."""

    cut = False

    async def _reattach(self) -> None:
        await super()._reattach()
        if not self.cut:
            self.cut = True
            assert self._ws is not None
            self._ws.transport.abort()
            await asyncio.sleep(0.05)  # the read loop sees the cut while the reconnect runs


def test_a_connection_lost_during_the_reconnect_is_reconnected_again() -> None:
    port = free_port()

    async def run() -> None:
        async with _CutAfterReattach(f"http://127.0.0.1:{port}", request_timeout_s=60) as client:
            session = await client.open_session()
            problem = GENERATOR.by_seed(500)
            await session.reset(problem_id=problem.problem_id)
            step = asyncio.ensure_future(session.step("solver", rf"\boxed{{{problem.answer}}}"))
            await asyncio.sleep(0)
            await client.drop(reconnect=True)
            result = await asyncio.wait_for(step, 20)
            assert result.observation.t == 1 and client.cut and client.reconnects == 2

    with server(port):
        asyncio.run(run())
