"""Faults: a client process killed mid-episode, SIGTERM to the server with a trajectory log.

(A grading worker killed with SIGKILL is covered in test_grading_pool.py.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from reliability_helpers import PROBLEMS, RawMux, play_reference_episode

from env_server.cli import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "env_server.cli", "serve", "--port", str(port),
                                "--log-level", "warning", *args], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process=process)
    return process, url


CLIENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from reliability_helpers import PROBLEMS, RawMux
    mux = RawMux({url!r})
    opened = mux.request("open")
    session = opened["session_id"]
    problem = PROBLEMS.by_seed(77)
    mux.request("reset", session, {{"problem_id": problem.problem_id}})
    text = "\\\\boxed{{" + problem.answer + "}}"
    for role, content in (("solver", text), ("verifier", "VERDICT: CORRECT"), ("judge", text)):
        reply = mux.request("step", session, {{"role": role, "content": content}})
    print(json.dumps({{"session_id": session, "resume_token": opened["data"]["resume_token"],
                      "episode_id": reply["data"]["observation"]["episode_id"]}}), flush=True)
    time.sleep(600)
""")


def test_killed_client_reattaches_with_its_resume_token_and_gets_the_rewards(server_url) -> None:
    code = CLIENT.format(tests=str(Path(__file__).resolve().parents[1] / "helpers"), url=server_url)
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(client.stdout.readline())
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    mux = RawMux(server_url)
    # without the token: refused
    denied = mux.request("attach", info["session_id"], {"resume_token": "not-the-token"})
    assert denied["type"] == "error" and denied["data"]["code"] == "RESUME_DENIED"
    attached = mux.request("attach", info["session_id"], {"resume_token": info["resume_token"]})
    assert attached["type"] == "attached"
    reply = mux.request("rewards", info["session_id"], {"wait": True, "timeout_s": 30})
    record = reply["data"]["record"]
    assert record["episode_id"] == info["episode_id"] and record["episode_reward"] == 1.0
    mux.close()


def test_sigterm_drains_grading_and_logs_every_completed_episode_once(tmp_path) -> None:
    log = tmp_path / "trajectories.jsonl"
    process, url = start_server("--trajectory-log", str(log), "--shutdown-grace", "20", "--grading-workers", "1",
                                "--grading-timeout", "3")
    try:
        mux = RawMux(url)
        graded = [play_reference_episode(mux, seed)["episode_id"] for seed in range(5)]
        # finished debates whose grading is still running when SIGTERM arrives (slow answers)
        in_flight = []
        for k in range(3):
            session = mux.request("open")["session_id"]
            problem = PROBLEMS.by_seed(100 + k)
            reply = mux.request("reset", session, {"problem_id": problem.problem_id})
            in_flight.append(reply["data"]["observation"]["episode_id"])
            slow = f"\\boxed{{9^{{9^{{9^{{{k + 2}}}}}}}}}"
            for role, content in (("solver", slow), ("verifier", "VERDICT: CORRECT"), ("judge", slow)):
                mux.request("step", session, {"role": role, "content": content})
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert time.monotonic() - start < 20 + 10  # within the grace period (plus start-up slack)
        # uvicorn shuts down gracefully, then re-raises the signal so the exit status reports it
        assert process.returncode in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
    with pytest.raises(OSError):
        RawMux(url)  # it no longer accepts connections
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    ids = [line["episode_id"] for line in lines]
    assert len(ids) == len(set(ids)), "an episode was logged twice"
    assert set(graded + in_flight) <= set(ids), "a completed episode is missing from the trajectory log"
    for line in lines:  # all turns (what was said), rewards and markers (the graded record)
        assert line["turns"] and len(line["turns"]) == len(line["rewards"]["turns"])
        assert "episode_reward" in line["rewards"]
        assert all("reward" in turn and "error_kind" in turn for turn in line["rewards"]["turns"])
    by_id = {line["episode_id"]: line for line in lines}
    assert all(by_id[e]["rewards"]["episode_reward"] == 1.0 for e in graded)
    # the slow answers were cut by the hard limit during the drain, not lost
    assert all(by_id[e]["rewards"]["turns"][0]["error_kind"] == "grading_timeout" for e in in_flight)
