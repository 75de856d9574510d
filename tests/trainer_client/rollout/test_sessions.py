"""The session ledger against a real server: sessions a process left open (its connection
gone, an episode in flight) are closed by the next process, not left to the resume window."""

from __future__ import annotations

import json
import urllib.request

from env_server.cli import running_server
from env_server.client.replicas import SyncReplicaPool
from trainer_client.rollout.sessions import SessionLedger


def _sessions(url: str) -> int:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:
        return int(json.loads(response.read())["sessions"])


def test_sessions_left_open_are_closed_by_the_next_process_and_its_own_at_the_end(tmp_path):
    with running_server(["--grading-workers", "1"]) as url:
        ledger = SessionLedger(tmp_path / "env_sessions.jsonl")
        assert (tmp_path / "env_sessions.jsonl").stat().st_mode & 0o777 == 0o600  # resume tokens inside
        pool = SyncReplicaPool(url)
        sessions = [pool.open_session() for _ in range(3)]
        for session in sessions:
            ledger.opened(pool.replica_of(session), session)
        sessions[0].reset(seed=1)  # an episode in flight
        ledger.closed(sessions[2].session_id)
        sessions[2].close()
        pool.close()  # the connection goes, as when the process dies: the sessions wait for it
        assert _sessions(url) == 2

        later = SessionLedger(tmp_path / "env_sessions.jsonl")  # the next process of the run
        assert [s["session_id"] for s in later.open_sessions()] == [s.session_id for s in sessions[:2]]
        assert later.close_left_open() == (2, 0)
        assert _sessions(url) == 0 and later.open_sessions() == []
        assert later.close_left_open() == (0, 0)

        pool = SyncReplicaPool(url)  # the new process's own sessions, closed at its end
        for _ in range(2):
            session = pool.open_session()
            later.opened(pool.replica_of(session), session)
        assert _sessions(url) == 2
        assert later.close_own() == 2
        assert _sessions(url) == 0 and later.open_sessions() == []
        pool.close()
