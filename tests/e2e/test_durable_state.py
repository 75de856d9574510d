"""Durable sessions (issue 16): ``mathdebate serve --state-dir`` survives ``kill -9``.

A real server in a subprocess is killed with SIGKILL in the middle of 200 concurrent debates and
restarted on the same port with the same state directory; the client re-attaches its sessions
with their old resume tokens and finishes every episode. Also: a damaged journal tail is
reported and the rest recovered, and a journal written for another problem source refuses to
start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import killable_server

from env_server.cli import free_port
from env_server.client import MuxClient, MuxSession
from env_server.debate.problems import load_problem_source
from env_server.protocol.grades import Grade
from env_server.protocol.markers import ErrorKind
from env_server.service.journal import StateJournal

PROBLEMS = load_problem_source(None)


def durable_server(state_dir: Path, port: int, log_path: Path, *extra: str):
    """``mathdebate serve --state-dir`` on ``port``, logging to ``log_path``."""
    return killable_server(port, "--state-dir", str(state_dir), *extra, log_path=log_path)


class CountingClient(MuxClient):
    """A ``MuxClient`` that counts the ``rewards`` frames pushed per episode id (what went over
    the wire, before the client's de-duplication)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.pushed: Counter[str] = Counter()

    def _dispatch_push(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "rewards" and frame["data"].get("status") == "graded":
            self.pushed[frame["data"]["episode_id"]] += 1
        super()._dispatch_push(frame)


def _http_rewards(url: str, episode_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/episodes/{episode_id}/rewards", timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


def _worker_answer(i: int) -> str:
    """A wrong answer no event-loop fast path decides (a cube root): graded by a worker."""
    return f"\\boxed{{\\sqrt[3]{{{100003 + i}}}}}"


async def _finish(session: MuxSession, answer: str, reject_once: bool) -> None:
    """Play the session's current episode to its end from wherever it is (state says)."""
    state = await session.state()
    while not state["done"]:
        t, role = state["step_count"], state["role"]
        if role == "solver":
            await session.step("solver", answer, t=t)
        elif role == "verifier":
            verdict = "VERDICT: INCORRECT\nre-check the last step" if reject_once and state["round"] == 0 \
                else "VERDICT: CORRECT"
            await session.step("verifier", verdict, t=t)
        else:
            await session.step("judge", answer, t=t)
        state = await session.state()


def test_kill_9_mid_200_debates_restart_and_reattach_loses_nothing(tmp_path) -> None:
    """200 sessions: 100 debates over (half graded by a worker, so some are still ungraded at
    the kill), 50 mid-debate, 50 with a verifier step in flight when the server is killed.
    After the restart every session re-attaches with its old token, every episode finishes,
    each record arrives at least once on the wire and once per episode id at the client, the
    in-flight steps (re-sent with their ``t``) act once, and records graded before the crash
    are pullable by id."""
    state_dir, port, log_path = tmp_path / "state", free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    n = 200
    problems = [PROBLEMS.by_seed(1000 + i) for i in range(n)]
    answers = [_worker_answer(i) if i % 2 else f"\\boxed{{{p.answer}}}" for i, p in enumerate(problems)]

    async def scenario() -> None:
        client = CountingClient(url)
        with durable_server(state_dir, port, log_path) as first:
            sessions = [await client.open_session() for _ in range(n)]
            episode_ids = [(await s.reset(problem_id=p.problem_id)).observation.episode_id
                           for s, p in zip(sessions, problems, strict=True)]
            await asyncio.gather(*(s.step("solver", a, t=0) for s, a in zip(sessions, answers, strict=True)))
            await asyncio.gather(*(s.step("verifier", "VERDICT: CORRECT", t=1) for s in sessions[:100]))
            await asyncio.gather(*(s.step("judge", a, t=2) for s, a in zip(sessions[:50], answers[:50], strict=True)))
            await asyncio.gather(*(s.step("verifier", "VERDICT: INCORRECT\nno", t=1) for s in sessions[100:150]))
            graded_before = episode_ids[:50]
            assert all(await asyncio.gather(*(s.rewards(e) for s, e in zip(sessions[:50], graded_before, strict=True))))
            # debates 50-99 end just before the kill: their 25 worker grades (one worker) are
            # mostly still running, so the restarted server grades them again
            await asyncio.gather(*(s.step("judge", a, t=2) for s, a in zip(sessions[50:100], answers[50:100],
                                                                             strict=True)))
            in_flight = [asyncio.ensure_future(s.step("verifier", "VERDICT: CORRECT", t=1)) for s in sessions[150:]]
            await asyncio.sleep(0.002)  # the batch goes out; the kill races the replies
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            await asyncio.sleep(0.5)  # the client is reconnecting with backoff meanwhile
            assert not client.connected

        with durable_server(state_dir, port, log_path):
            stats = json.loads(urllib.request.urlopen(f"{url}/stats", timeout=10).read())
            assert stats["sessions_recovered"] == n
            # the client reconnects on its own, re-attaches with the old resume tokens and
            # re-sends the steps that were in flight (with their t: they act at most once)
            resent = await asyncio.wait_for(asyncio.gather(*in_flight), 60)
            assert all(not r.done and r.observation.role == "judge" for r in resent)
            for e in graded_before:  # graded before the crash: pullable by id at once
                assert _http_rewards(url, e)["status"] == "graded"
            # a step re-sent by hand with the t of a turn taken answers the stored reply
            again = await asyncio.gather(*(s.step("verifier", "VERDICT: CORRECT", t=1) for s in sessions[150:]))
            assert [r.raw for r in again] == [r.raw for r in resent]
            assert client.reconnects == 1
            await asyncio.gather(*(_finish(s, a, reject_once=100 <= i < 150)
                                   for i, (s, a) in enumerate(zip(sessions, answers, strict=True))))
            records = await asyncio.gather(*(s.rewards(e, timeout_s=60) for s, e in zip(sessions, episode_ids,
                                                                                        strict=True)))
            final = await asyncio.gather(*(s.state() for s in sessions))
            await client.close()

        for i, (record, state) in enumerate(zip(records, final, strict=True)):
            assert record is not None and record.episode_id == episode_ids[i], i
            assert state["episode_id"] == episode_ids[i] and state["done"]
            # nothing acted twice: accepted at round 0 -> 3 turns; rejected, then the same answer
            # again (circular-critique stop: straight to the judge) -> 4 turns; the in-flight
            # accepts were re-sent with t=1 and acted once -> 3 turns
            assert state["step_count"] == (4 if 100 <= i < 150 else 3), (i, state)
            assert record.episode_reward == (0.0 if i % 2 else 1.0), (i, record.episode_reward)
        assert set(client.pushed) == set(episode_ids), "every record is pushed at least once"
        assert set(client.pushed) >= set(graded_before)

    asyncio.run(scenario())
    recovered = re.search(r"state journal: recovered 200 sessions and 200 episodes \((\d+) graded\)",
                          log_path.read_text())
    assert recovered is not None
    assert 50 <= int(recovered.group(1)) < 100, "some debates were over but not graded at the kill"


def test_damaged_journal_tail_is_reported_and_the_rest_recovered(tmp_path) -> None:
    """Garbage after the last frame (a torn write) and a frame with a wrong checksum: the
    server logs where the damaged tail starts, recovers everything before it and serves."""
    state_dir, port, log_path = tmp_path / "state", free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    problem = PROBLEMS.by_seed(7)

    async def scenario() -> None:
        client = MuxClient(url)
        with durable_server(state_dir, port, log_path) as server:
            graded, mid = await client.open_session(), await client.open_session()
            await graded.reset(problem_id=problem.problem_id)
            for t, (role, text) in enumerate((("solver", problem.answer), ("verifier", "VERDICT: CORRECT"),
                                               ("judge", problem.answer))):
                await graded.step(role, f"\\boxed{{{text}}}" if role != "verifier" else text, t=t)
            record = await graded.rewards()
            assert record is not None
            await mid.reset(problem_id=problem.problem_id)
            await mid.step("solver", "\\boxed{0}", t=0)
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
        await client.drop()
        (journal,) = state_dir.glob("journal-*.log")
        with journal.open("ab") as f:  # a torn frame: a header promising more bytes than follow
            f.write(b"\x00\x10\x00\x00\x12\x34\x56\x78[\"A\",\"x")
        with durable_server(state_dir, port, log_path):
            await client.reconnect()
            assert _http_rewards(url, record.episode_id)["record"]["episode_reward"] == record.episode_reward
            state = await mid.state()
            assert state["step_count"] == 1 and state["role"] == "verifier"
            await mid.step("verifier", "VERDICT: CORRECT", t=1)
            await client.close()

    asyncio.run(scenario())
    assert "damaged or truncated tail" in log_path.read_text()


def test_compaction_while_serving_keeps_the_live_state(tmp_path) -> None:
    """With a 1 MB compaction threshold, 1,000 graded debates (about 1.6 MB of journal) make
    the server rewrite its journal as a snapshot while serving; after ``kill -9`` and a
    restart, the records and an open episode are all there."""
    state_dir, port, log_path = tmp_path / "state", free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    extra = ("--state-compact-bytes", str(1 << 20), "--reap-interval", "0.2")

    async def scenario() -> None:
        client = MuxClient(url)
        with durable_server(state_dir, port, log_path, *extra) as server:
            sessions = [await client.open_session() for _ in range(50)]
            episode_ids: list[str] = []
            for round_ in range(20):
                resets = await asyncio.gather(*(s.reset(seed=round_ * 50 + i) for i, s in enumerate(sessions)))
                episode_ids += [r.observation.episode_id for r in resets]
                for t, role in enumerate(("solver", "verifier", "judge")):
                    answers = [PROBLEMS.get(r.observation.problem_id).answer for r in resets]
                    await asyncio.gather(*(s.step(role, "VERDICT: CORRECT" if role == "verifier" else f"\\boxed{{{a}}}", t=t)
                                           for s, a in zip(sessions, answers, strict=True)))
            await asyncio.gather(*(s.rewards() for s in sessions))
            await asyncio.sleep(0.5)  # a reaper pass: compaction
            journals = sorted(state_dir.glob("journal-*.log"))
            assert len(journals) == 1 and journals[0].name != "journal-000001.log", journals
            open_episode = (await sessions[0].reset(seed=99_999)).observation.episode_id
            await sessions[0].step("solver", "\\boxed{1}", t=0)
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
        await client.drop()
        with durable_server(state_dir, port, log_path, *extra):
            for e in episode_ids[::37]:
                assert _http_rewards(url, e)["status"] == "graded"
            await client.reconnect()
            state = await sessions[0].state()
            assert state["episode_id"] == open_episode and state["step_count"] == 1
            await client.close()

    asyncio.run(scenario())


def test_journal_recovers_the_frames_before_a_corrupted_one(tmp_path, caplog) -> None:
    """In-process: a flipped byte in the third frame's payload fails its checksum; the two
    frames before it are recovered and the offset and size of the dropped tail are logged."""
    journal = StateJournal(tmp_path, fingerprint="f")
    journal.start([
        StateJournal.session_frame("s1", b"\x01" * 32, 100.0),
        StateJournal.episode_frame("s1", "e1", "gen/x/1", 2, "debate", True, 100, 101.0),
    ])
    journal.append(StateJournal.action_frame("e1", 0, "solver", "\\boxed{1}"))
    journal.append(StateJournal.grade_frame("e1", 0, Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")))
    journal.close()
    (path,) = tmp_path.glob("journal-*.log")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last frame (the grade)
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="env_server.service.journal"):
        state = StateJournal(tmp_path, fingerprint="f").recover()
    assert state.sessions["s1"].token_hash == b"\x01" * 32
    assert state.episodes["e1"].actions == [("solver", "\\boxed{1}")]
    assert state.episodes["e1"].grades == {}  # the damaged frame is not applied
    assert state.dropped_bytes > 0
    assert "damaged or truncated tail" in caplog.text


def test_journal_keeps_worker_grades_and_records_and_drops_abandoned_episodes(tmp_path) -> None:
    """What each frame kind rebuilds: grades by turn, the record's bytes, abandonment, closing."""
    journal = StateJournal(tmp_path, fingerprint="f")
    journal.start([])
    for frame in (
        StateJournal.session_frame("s1", b"\x02" * 32, 1.0),
        StateJournal.session_frame("s2", b"\x03" * 32, 1.0),
        StateJournal.episode_frame("s1", "e1", "p", 2, "debate", True, 100, 2.0),
        StateJournal.action_frame("e1", 0, "solver", "a"),
        StateJournal.grade_frame("e1", 0, Grade(True, None, "worker")),
        StateJournal.episode_frame("s1", "e2", "p", 2, "single", True, 100, 3.0),
        StateJournal.abandoned_frame("e2"),
        StateJournal.episode_frame("s2", "e3", "p", 1, "single", False, 100, 4.0),
        StateJournal.action_frame("e3", 0, "solver", "b"),
        StateJournal.record_frame("e3", 5.0, b'{"episode_reward":1.0,"x":"\\n"}'),
        StateJournal.closed_frame("s2"),
    ):
        journal.append(frame)
    journal.close()
    state = StateJournal(tmp_path, fingerprint="f").recover()
    assert set(state.sessions) == {"s1"} and set(state.episodes) == {"e1", "e3"}
    assert state.episodes["e1"].grades == {0: Grade(True, None, "worker")}
    assert state.episodes["e3"].record_json == b'{"episode_reward":1.0,"x":"\\n"}'
    assert state.episodes["e3"].graded_at == 5.0 and state.last_write == 5.0
    with pytest.raises(RuntimeError, match="another problem source"):
        StateJournal(tmp_path, fingerprint="g").recover()


def test_a_journal_for_another_problem_source_refuses_to_start(tmp_path, math500_path) -> None:
    state_dir, port, log_path = tmp_path / "state", free_port(), tmp_path / "server.log"
    with durable_server(state_dir, port, log_path):
        pass
    with log_path.open("ab") as log:
        code = subprocess.run(
            [sys.executable, "-m", "env_server.cli", "serve", "--port", str(port), "--state-dir", str(state_dir),
             "--problems", str(math500_path), "--grading-workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, timeout=60).returncode
    assert code != 0
    assert "was written for another problem source" in log_path.read_text()


def test_compaction_waits_for_the_file_to_double_its_snapshot(tmp_path) -> None:
    """A live state bigger than ``compact_bytes`` (many retained records) is not rewritten on
    every reaper pass: the file must pass the threshold *and* twice its starting snapshot."""
    frame = StateJournal.action_frame("e1", 0, "solver", "x" * 1000)
    journal = StateJournal(tmp_path, fingerprint="f", compact_bytes=100 * len(frame))
    journal.start([frame] * 300)  # a snapshot three times the threshold
    assert journal.snapshot_bytes > journal.compact_bytes and not journal.needs_compaction
    while journal.bytes_written + len(frame) <= 2 * journal.snapshot_bytes:
        journal.append(frame)
    assert not journal.needs_compaction
    journal.append(frame)
    assert journal.needs_compaction
    journal.start([frame] * 10)  # a small live state: the threshold rules again
    while journal.bytes_written + len(frame) <= journal.compact_bytes:
        journal.append(frame)
    assert not journal.needs_compaction
    journal.append(frame)
    assert journal.needs_compaction
    journal.close()
