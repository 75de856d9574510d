"""Hostile answers through the real protocol, in every field that reaches grading.

Each is cut within the hard limit (the ``server_url`` fixture kills a grade after 2 s), nothing
executes, it earns 0, normal sessions beside a hostile flood are served without errors and
graded correctly, and a session flooding costly grades does not hold back another session's
grade. Correctness only: the timings under a flood (p99 and steps/s against calm) are
``benchmarks/hostile_load.py``'s.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import PROBLEMS, RawMux, play_reference_episode

SENTINEL = Path("/tmp/mathdebate-pwned")
HOSTILE = {
    "tower": r"9^{9^{9^{9^{9}}}}",
    "factorial": r"100000!",
    "huge_power": r"10^{10^{100}}",
    "nested_braces": "{" * 3000 + "1" + "}" * 3000,
    "unclosed_braces": "{" * 5000,
    "import": f"__import__('os').system('touch {SENTINEL}')",
    "dunder_walk": "().__class__.__bases__[0].__subclasses__()",
    "lambda": f"(lambda: __import__('os').system('touch {SENTINEL}'))()",
    "eval": f"eval(\"__import__('os').system('touch {SENTINEL}')\")",
    "long_30kb": "1+" * 15_000 + "1",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_answer_is_graded_zero_within_the_limit_and_nothing_runs(server_url, name: str) -> None:
    SENTINEL.unlink(missing_ok=True)
    mux = RawMux(server_url)
    problem = PROBLEMS.by_seed(21)
    session = mux.request("open")["session_id"]
    mux.request("reset", session, {"problem_id": problem.problem_id})
    payload = HOSTILE[name]
    start = time.monotonic()
    for role, content in (("solver", f"\\boxed{{{payload}}}"),
                          ("verifier", f"{payload} VERDICT: CORRECT"),  # critique text never graded, never run
                          ("judge", f"\\boxed{{{payload}}}")):
        assert mux.request("step", session, {"role": role, "content": content})["type"] == "observation"
    record = mux.request("rewards", session, {"wait": True, "timeout_s": 30})["data"]["record"]
    # two graded turns, each killed at 2 s at worst (deduplicated: the same answer twice)
    assert time.monotonic() - start < 2 * 2 + 6
    assert record["episode_reward"] == 0.0
    assert all(turn["reward"] == 0.0 for turn in record["turns"] if turn["role"] == "solver")
    assert not SENTINEL.exists()
    # the server keeps serving, correctly
    assert play_reference_episode(mux, 22)["episode_reward"] == 1.0
    mux.close()


def test_over_long_content_is_a_typed_error_and_the_episode_continues(server_url) -> None:
    mux = RawMux(server_url)
    session = mux.request("open")["session_id"]
    mux.request("reset", session, {"problem_id": PROBLEMS.by_seed(3).problem_id})
    reply = mux.request("step", session, {"role": "solver", "content": "\\boxed{" + "9" * 100_000 + "}"})
    assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_ACTION"
    assert reply["data"]["error_kind"] == "too_long"
    assert play_reference_episode(mux, 3, session)["episode_reward"] == 1.0
    mux.close()


def _normal_sessions(server_url: str, sessions: int, episodes: int) -> list[Any]:
    """Play ``episodes`` reference debates in each of ``sessions`` threads; return every step
    reply and episode reward (or the exception a thread raised)."""
    results: list[Any] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            mux = RawMux(server_url)
            for e in range(episodes):
                record = play_reference_episode(mux, 1000 + i * episodes + e)
                with lock:
                    results.append(record["episode_reward"])
            mux.close()
        except Exception as exc:  # reported by the assertion below
            with lock:
                results.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_normal_sessions_are_served_correctly_under_a_hostile_flood(server_url) -> None:
    # correctness only (0 errors, every reference episode earns 1, nothing runs); the timings
    # (p99 and steps/s against calm) live in benchmarks/hostile_load.py
    SENTINEL.unlink(missing_ok=True)
    stop = threading.Event()

    def hostile() -> None:
        mux = RawMux(server_url)
        session = mux.request("open")["session_id"]
        k = 0
        while not stop.is_set():
            mux.request("reset", session, {"problem_id": PROBLEMS.by_seed(50).problem_id})
            payload = list(HOSTILE.values())[k % len(HOSTILE)] + "+" * (k // len(HOSTILE))  # never cached
            for role, content in (("solver", f"\\boxed{{{payload}}}"), ("verifier", "VERDICT: CORRECT"),
                                  ("judge", f"\\boxed{{{payload}}}")):
                mux.request("step", session, {"role": role, "content": content})
            k += 1
        mux.close()

    attackers = [threading.Thread(target=hostile) for _ in range(2)]
    for attacker in attackers:
        attacker.start()
    try:
        time.sleep(0.5)
        results = _normal_sessions(server_url, sessions=10, episodes=8)
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join()
    assert results == [1.0] * 80, [r for r in results if r != 1.0][:3]
    assert not SENTINEL.exists()


def test_a_session_flooding_costly_grades_does_not_hold_back_another_sessions_grade(server_url) -> None:
    """Fair admission to the grading workers: a session whose costly grades fill the queue
    waits behind its own work; another session's grade that needs a worker is started before
    them, and a costly but correct answer still earns 1."""
    flood = RawMux(server_url)
    flooder = flood.request("open")["session_id"]
    tower = iter(range(10_000))
    episodes = 6  # 12 grades, each killed at the fixture's 2 s: about 12 s of both workers
    for _ in range(episodes):
        assert flood.request("reset", flooder, {"problem_id": PROBLEMS.by_seed(60).problem_id})["type"] == "observation"
        for role in ("solver", "verifier", "judge"):
            content = "VERDICT: CORRECT" if role == "verifier" else f"\\boxed{{9^{{9^{{9^{{9^{{{next(tower)}}}}}}}}}}}"
            assert flood.request("step", flooder, {"role": role, "content": content})["type"] == "observation"
    flood_episode = flood.request("state", flooder)["data"]["episode_id"]
    # the other session: a correct answer no event-loop fast path decides (a worker grades it)
    other = RawMux(server_url)
    problem = PROBLEMS.by_seed(7)
    costly = rf"\left({problem.answer}\right) \cdot \frac{{\sin^{{2}} x + \cos^{{2}} x}}{{1}}"
    record = play_reference_episode(other, 7, answer=costly)
    assert record["episode_reward"] == 1.0
    assert [turn["reward"] for turn in record["turns"] if turn["role"] == "solver"] == [1.0]
    # graded ahead of the flood's earlier grades: the flooder's last episode is still waiting
    # (first come, first served, --grading-fairness off, would have graded it first)
    pending = flood.request("rewards", flooder, {"episode_id": flood_episode})["data"]
    assert pending["status"] == "pending", pending
    flood.close()
    other.close()
