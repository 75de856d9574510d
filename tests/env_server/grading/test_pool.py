"""The grading pool: real worker processes, hard kill, worker replacement, cache."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from env_server.grading.pool import Grader, GradingConfig
from env_server.protocol.grades import Grade
from env_server.protocol.markers import ErrorKind


def run(coro):
    return asyncio.run(coro)


def test_pool_grades_caches_and_deduplicates() -> None:
    async def main() -> None:
        grader = Grader(GradingConfig(workers=2))
        await grader.start()
        try:
            # within the 6-significant-figure tolerance: only the worker can decide it
            assert await grader.grade(r"\frac13", "0.333333") == Grade(True, None, "worker")
            assert await grader.grade(r"\frac13", "0.333333") == Grade(True, None, "cache")
            assert await grader.grade(r"\frac12", "0.5") == Grade(True, None, "closed_form")
            assert await grader.grade("42", " 42 ") == Grade(True, None, "exact")
            assert await grader.grade("42", None) == Grade(False, ErrorKind.MISSING_FINAL_ANSWER, "rule")
            assert (await grader.grade("42", "4" * 9000)).error_kind is ErrorKind.UNPARSEABLE_ANSWER
            results = await asyncio.gather(*(grader.grade("x^2", r"x \cdot x") for _ in range(20)))
            assert all(r.correct for r in results)
            assert grader.stats["deduplicated"] == 19
        finally:
            grader.close()

    run(main())


def test_hard_kill_replaces_the_worker_and_marks_a_timeout() -> None:
    async def main() -> None:
        # soft timeout above the hard one: only the wall-clock kill can stop the tower
        grader = Grader(GradingConfig(workers=1, hard_timeout_s=1.0, soft_timeout_s=30))
        await grader.start()
        try:
            before = grader.worker_pids
            start = time.monotonic()
            grade = await grader.grade("2", r"9^{9^{9^9}}")
            assert grade == Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
            assert time.monotonic() - start < 10
            assert grader.stats["timeouts"] == 1
            assert (await grader.grade("3", r"\frac{6}{2}")).correct  # a fresh worker serves
            assert grader.worker_pids != before
        finally:
            grader.close()

    run(main())


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_until_a_worker_is_busy(pids: list[int], timeout_s: float = 20.0) -> None:
    start = {pid: cpu_seconds(pid) for pid in pids}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if any(cpu_seconds(pid) - start[pid] >= 0.2 for pid in pids):
            return
    raise AssertionError("no grading worker started the task")


def test_sigkilled_worker_gives_grading_timeout_and_is_replaced() -> None:
    async def main() -> None:
        grader = Grader(GradingConfig(workers=2, hard_timeout_s=30, soft_timeout_s=30))
        await grader.start()
        try:
            stuck = asyncio.create_task(grader.grade("2", r"10^{10^{10^{10}}}+1"))
            # Kill only once a worker is busy on the tower: a kill before the task starts is
            # the idle-death case (next test), which pebble reports differently.
            await wait_until_a_worker_is_busy(grader.worker_pids)
            for pid in grader.worker_pids:
                os.kill(pid, signal.SIGKILL)
            assert (await stuck) == Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
            assert grader.stats["worker_deaths"] >= 1
            assert (await grader.grade(r"\sqrt{4}", "2")).correct
        finally:
            grader.close()

    run(main())


def test_pool_survives_all_idle_workers_being_killed() -> None:
    """pebble declares the pool broken when idle workers die with no task running; the grader
    replaces the pool and the next grade succeeds."""

    async def main() -> None:
        grader = Grader(GradingConfig(workers=2))
        await grader.start()
        try:
            for pid in grader.worker_pids:
                os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.5)
            assert (await grader.grade("x + 1", "1 + x")) == Grade(True, None, "worker")
        finally:
            grader.close()

    run(main())
