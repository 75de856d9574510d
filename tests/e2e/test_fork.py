"""Forking an episode at turn ``t`` (RFC 0007), on the wire of a real server: ``fork`` on
``/ws/mux`` and on OpenEnv's ``/ws``, and ``POST /episodes/{episode_id}/fork``. The fork's
observation is the original's ``state(t)`` under its own episode id; the original goes on
unchanged; the fork is played and graded by the server like any episode; an unknown episode or a
``t`` out of range gets a typed error and the server keeps serving; forks count against the
session limit; a fork survives ``kill -9`` of a server with ``--state-dir`` and re-attaches."""

from __future__ import annotations

import json
import signal

import httpx
from reliability_helpers import PROBLEMS, RawMux, killable_server, open_ws

from env_server.cli import free_port, running_server

PROBLEM = PROBLEMS.by_seed(11)
RIGHT = f"So the answer is \\boxed{{{PROBLEM.answer}}}."
WRONG = "So the answer is \\boxed{-12345}."


def _started(mux: RawMux) -> str:
    """A session whose episode has two turns (a wrong answer, then a verifier's rejection): at t=2."""
    session = mux.request("open")["session_id"]
    mux.request("reset", session, {"problem_id": PROBLEM.problem_id, "episode_id": f"orig-{session[:8]}",
                                   "max_rounds": 2})
    for role, content in (("solver", WRONG), ("verifier", "The sum is off. VERDICT: INCORRECT")):
        assert mux.request("step", session, {"role": role, "content": content})["type"] == "observation"
    return session


def _without_id(value):
    """``value`` without its ``episode_id`` keys (the fork's own), at any depth."""
    if isinstance(value, dict):
        return {k: _without_id(v) for k, v in value.items() if k != "episode_id"}
    return [_without_id(v) for v in value] if isinstance(value, list) else value


def test_mux_fork_starts_at_state_t_leaves_the_original_and_is_graded_as_any_episode() -> None:
    with running_server(["--grading-workers", "1"]) as url:
        mux = RawMux(url)
        session = _started(mux)
        original = mux.request("state", session)["data"]
        for t in (0, 1, 2):
            forked = mux.request("fork", session, {"t": t})
            assert forked["type"] == "forked", forked
            data = forked["data"]
            replay = mux.request("state", session, {"t": t})["data"]["observation"]
            assert data["observation"]["observation"]["episode_id"] == data["episode_id"] != original["episode_id"]
            assert _without_id(data["observation"]) == _without_id(replay)  # state(t), its own episode id
            assert data["observation"]["observation"]["t"] == t
            assert mux.request("state", data["session_id"])["data"]["step_count"] == t
        # the last fork (t=2: the solver's revision) plays on: a right answer, accepted, judged
        fork = data["session_id"]
        for role, content in (("solver", RIGHT), ("verifier", "VERDICT: CORRECT"), ("judge", RIGHT)):
            assert mux.request("step", fork, {"role": role, "content": content})["type"] == "observation"
        record = mux.request("rewards", fork, {"wait": True, "timeout_s": 30})["data"]
        assert record["status"] == "graded" and record["record"]["episode_reward"] == 1.0
        assert [t["correct"] for t in record["record"]["turns"]][:3] == [False, True, True]  # the replayed turns graded too
        # the original is where it was, and goes on its own way
        assert mux.request("state", session)["data"] == original
        for role, content in (("solver", WRONG), ("judge", WRONG)):  # the same rejected answer: straight to the judge
            assert mux.request("step", session, {"role": role, "content": content})["type"] == "observation"
        graded = mux.request("rewards", session, {"wait": True, "timeout_s": 30})["data"]
        assert graded["record"]["episode_reward"] == 0.0
        # a finished episode forks too (t up to its last observation), and by episode id of the session
        again = mux.request("fork", session, {"t": 3, "episode_id": original["episode_id"]})
        assert again["type"] == "forked", again
        assert again["data"]["observation"]["observation"]["role"] == "judge"
        # typed errors, and the connection and the server go on serving
        out = mux.request("fork", session, {"t": 9})
        assert (out["type"], out["data"]["code"]) == ("error", "OUT_OF_RANGE"), out
        unknown = mux.request("fork", session, {"t": 0, "episode_id": "no-such-episode"})
        assert (unknown["type"], unknown["data"]["code"]) == ("error", "UNKNOWN_EPISODE"), unknown
        bad = mux.request("fork", session, {"t": "one"})
        assert (bad["type"], bad["data"]["code"]) == ("error", "VALIDATION_ERROR"), bad
        assert mux.request("ping")["type"] == "pong"
        mux.close()


def test_forks_count_against_the_session_limit() -> None:
    with running_server(["--grading-workers", "1", "--max-sessions", "3"]) as url:
        mux = RawMux(url)
        session = _started(mux)
        assert mux.request("fork", session, {"t": 1})["type"] == "forked"
        assert mux.request("fork", session, {"t": 1})["type"] == "forked"
        full = mux.request("fork", session, {"t": 1})
        assert (full["type"], full["data"]["code"]) == ("error", "CAPACITY_REACHED"), full
        assert httpx.get(f"{url}/stats", timeout=10).json()["sessions"] == 3
        mux.close()


def test_http_and_openenv_ws_forks() -> None:
    with running_server(["--grading-workers", "1"]) as url:
        mux = RawMux(url)
        session = _started(mux)
        episode = mux.request("state", session)["data"]["episode_id"]
        replay = mux.request("state", session, {"t": 1})["data"]["observation"]
        # HTTP: the reply is the fork's observation; POST /step continues it by its episode id
        reply = httpx.post(f"{url}/episodes/{episode}/fork", json={"t": 1, "fork_episode_id": "http-fork"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert _without_id(reply.json()) == _without_id(replay) and reply.json()["observation"]["episode_id"] == "http-fork"
        step = httpx.post(f"{url}/step", json={"episode_id": "http-fork", "action": {"role": "verifier",
                                                                                     "content": "VERDICT: CORRECT"}},
                          timeout=30)
        assert step.status_code == 200 and step.json()["observation"]["t"] == 2
        assert httpx.post(f"{url}/episodes/no-such/fork", json={"t": 0}, timeout=10).status_code == 404
        assert httpx.post(f"{url}/episodes/{episode}/fork", json={"t": 7}, timeout=10).status_code == 422
        # OpenEnv's /ws: the connection plays the fork from then on
        ws = open_ws(url, "/ws")
        ws.send(json.dumps({"type": "reset", "data": {"problem_id": PROBLEM.problem_id}}))
        first = json.loads(ws.recv(timeout=15))["data"]
        ws.send(json.dumps({"type": "step", "data": {"role": "solver", "content": WRONG}}))
        json.loads(ws.recv(timeout=15))
        ws.send(json.dumps({"type": "fork", "data": {"t": 0}}))
        forked = json.loads(ws.recv(timeout=15))
        assert forked["type"] == "observation" and _without_id(forked["data"]) == _without_id(first)
        ws.send(json.dumps({"type": "state"}))
        state = json.loads(ws.recv(timeout=15))["data"]
        assert state["step_count"] == 0 and state["episode_id"] == forked["data"]["observation"]["episode_id"]
        ws.send(json.dumps({"type": "fork", "data": {"t": 5}}))
        error = json.loads(ws.recv(timeout=15))
        assert error["type"] == "error" and error["data"]["reason"] == "OUT_OF_RANGE", error
        ws.close()
        assert mux.request("state", session)["data"]["step_count"] == 2  # the original, untouched
        mux.close()


def test_a_fork_survives_kill_9_and_reattaches(tmp_path) -> None:
    port = free_port()
    state_dir = tmp_path / "state"
    with killable_server(port, "--state-dir", str(state_dir)) as server:
        url = f"http://127.0.0.1:{port}"
        mux = RawMux(url)
        session = _started(mux)
        forked = mux.request("fork", session, {"t": 1})["data"]
        before = mux.request("state", forked["session_id"])["data"]
        mux.close()
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
    with killable_server(port, "--state-dir", str(state_dir)):
        mux = RawMux(url)
        attached = mux.request("attach", forked["session_id"], {"resume_token": forked["resume_token"]})
        assert attached["type"] == "attached", attached
        assert attached["data"]["state"] == before
        reply = mux.request("step", forked["session_id"], {"role": "verifier", "content": "VERDICT: CORRECT"})
        assert reply["type"] == "observation" and reply["data"]["observation"]["t"] == 2
        mux.close()


def test_the_client_forks_a_session_and_plays_the_fork() -> None:
    """``SyncMuxSession.fork``: the fork starts at the original's ``state(t)``, steps from there
    with its own ``t``, is graded, and leaves the original where it was; a ``t`` past the episode
    is the server's ``OUT_OF_RANGE`` and the session goes on."""
    from env_server.client import MuxError, SyncMuxClient

    with running_server(["--grading-workers", "1"]) as url, SyncMuxClient(url) as client:
        session = client.open_session()
        session.reset(problem_id=PROBLEM.problem_id, max_rounds=1)
        session.step("solver", WRONG)
        fork, first = session.fork(1)
        assert first.observation.role.value == "verifier" and first.observation.t == 1
        assert first.observation.episode_id == fork.episode_id != session.episode_id
        for role, content in (("verifier", "VERDICT: INCORRECT"), ("judge", RIGHT)):
            fork.step(role, content)
        record = fork.rewards(wait=True, timeout_s=30)
        assert record is not None and [t.correct for t in record.turns] == [False, True, True]
        assert session.state()["step_count"] == 1  # the original is where it was
        try:
            session.fork(5)
        except MuxError as exc:
            assert exc.code == "OUT_OF_RANGE"
        else:
            raise AssertionError("a fork past the episode was accepted")
        assert session.step("verifier", "VERDICT: CORRECT").observation.t == 2
        fork.close()
