"""Hostile answers through the real protocol, in every field that reaches grading.

Each is cut within the hard limit (the ``server_url`` fixture kills a grade after 2 s), nothing
executes, it earns 0, and the p99 step latency of concurrent normal sessions stays within 2× of
its value without the hostile load (``benchmarks/hostile_load.py`` measures throughput too).
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

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


def _normal_p99(server_url: str, sessions: int, episodes: int) -> float:
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        mux = RawMux(server_url)
        session = mux.request("open")["session_id"]
        for e in range(episodes):
            problem = PROBLEMS.by_seed(1000 + i * episodes + e)
            mux.request("reset", session, {"problem_id": problem.problem_id})
            text = f"\\boxed{{{problem.answer}}}"
            for role, content in (("solver", text), ("verifier", "VERDICT: CORRECT"), ("judge", text)):
                start = time.perf_counter()
                mux.request("step", session, {"role": role, "content": content})
                with lock:
                    latencies.append(time.perf_counter() - start)
        mux.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies.sort()
    return latencies[int(0.99 * (len(latencies) - 1))]


def test_hostile_load_keeps_normal_p99_within_twice_its_baseline(server_url) -> None:
    # medians of three windows on both sides: a p99 of a few hundred steps on a shared 2-core
    # machine moves by milliseconds from one window to the next
    baseline = statistics.median(_normal_p99(server_url, sessions=10, episodes=8) for _ in range(3))
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
        loaded = statistics.median(_normal_p99(server_url, sessions=10, episodes=8) for _ in range(3))
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join()
    # steps answer before grading: hostile grading runs in killable workers, off the event loop
    assert loaded <= 2 * baseline, (loaded, baseline)
