"""Error-site markers end to end: every error kind is produced on a real server; hostile
answers are cut at the hard limit without stalling other sessions and never execute."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from env_server.client import MuxClient, MuxError
from env_server.debate.problems import ProblemGenerator
from env_server.protocol.markers import ErrorKind

GENERATOR = ProblemGenerator()


def run(coro):
    return asyncio.run(coro)


async def debate(session, seed: int, turns: list[tuple[str, str]]):
    """Play ``turns`` (``{answer}`` is replaced by the right answer); returns (step metadata
    kinds, rewards record)."""
    problem = GENERATOR.by_seed(seed)
    await session.reset(problem_id=problem.problem_id)
    kinds = []
    for role, content in turns:
        result = await session.step(role, content.replace("{answer}", problem.answer))
        kinds.append(result.metadata["error_kind"])
    return kinds, await session.rewards(timeout_s=60)


def test_every_error_kind_is_produced(server_url) -> None:
    async def main() -> set[str]:
        seen: set[str] = set()
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            await session.reset(seed=1)
            for role, content in [("judge", "x"), ("solver", " "), ("solver", "z" * 40_000)]:
                try:
                    await session.step(role, content)
                except MuxError as exc:  # rejected actions: an error frame with the kind
                    seen.add(exc.data["error_kind"])
            scripts = [
                # wrong answer falsely accepted; judge repeats it
                [("solver", r"\boxed{-77777}"), ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{-77777}")],
                # correct answer falsely rejected, then no box, a missing verdict, a repeated wrong answer
                [("solver", r"\boxed{{answer}}"), ("verifier", "VERDICT: INCORRECT"), ("solver", "no box"),
                 ("verifier", "hmm"), ("judge", r"\boxed{{answer}}")],
                # a repeated rejected answer goes straight to the judge (circular-critique stop, RFC 0006)
                [("solver", r"\boxed{-77777}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{-77777}"),
                 ("judge", r"\boxed{}{")],
                # a verifier repeating its review (case and spacing aside)
                [("solver", r"\boxed{-77777}"), ("verifier", "Wrong sign.\nVERDICT: INCORRECT"),
                 ("solver", r"\boxed{-77776}"), ("verifier", "wrong  sign. verdict: incorrect"), ("judge", r"\boxed{{answer}}")],
                # unparseable answer, and a tower that only the hard limit stops
                [("solver", r"\boxed{)(}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{9^{9^{9^{9}}}}"),
                 ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{{answer}}")],
            ]
            for seed, turns in enumerate(scripts, start=40):
                step_kinds, record = await debate(session, seed, turns)
                seen.update(k for k in step_kinds if k)
                seen.update(t.error_kind.value for t in record.turns if t.error_kind)
        return seen

    assert run(main()) == {kind.value for kind in ErrorKind}


def test_exponent_tower_is_cut_without_stalling_other_sessions(server_url) -> None:
    async def main() -> None:
        async with MuxClient(server_url) as client:
            hostile = await client.open_session()
            start = time.monotonic()
            tower = asyncio.create_task(debate(hostile, 90, [
                ("solver", r"\boxed{9^{9^{9^{9^{9}}}}}"), ("verifier", "VERDICT: CORRECT"), ("judge", r"\boxed{1}")]))
            latencies: list[float] = []

            async def normal(seed: int) -> float:
                session = await client.open_session()
                problem = GENERATOR.by_seed(seed)
                await session.reset(problem_id=problem.problem_id)
                for role, content in [("solver", problem.solution), ("verifier", "VERDICT: CORRECT"),
                                      ("judge", rf"\boxed{{{problem.answer}}}")]:
                    t0 = time.monotonic()
                    await session.step(role, content)
                    latencies.append(time.monotonic() - t0)
                return (await session.rewards(timeout_s=30)).episode_reward

            rewards = await asyncio.gather(*(normal(seed) for seed in range(200, 240)))
            others_done = time.monotonic()
            assert not tower.done()  # the tower's grade is still running
            _, record = await tower
            tower_done = time.monotonic()
            assert rewards == [1.0] * 40
            assert record.turns[0].error_kind is ErrorKind.GRADING_TIMEOUT
            assert record.turns[1].error_kind is ErrorKind.GRADING_TIMEOUT
            # the 40 normal debates (graded too) finished while the tower was still being graded,
            # and it was cut at the 2 s hard limit (plus scheduling slack)
            assert others_done < tower_done < start + 10
            assert max(latencies) < 1.5

    run(main())


def test_injection_payloads_never_execute_through_the_server(server_url, tmp_path: Path) -> None:
    target = Path("/tmp") / f"mathdebate-pwned-{uuid.uuid4().hex}"
    payloads = [
        rf"\boxed{{__import__('os').system('touch {target}')}}",
        rf"\boxed{{(lambda: open('{target}', 'w'))()}}",
        r"\boxed{().__class__.__bases__[0].__subclasses__()}",
        rf"\boxed{{\text{{exec(open('{target}','w'))}}}}",
    ]

    async def main() -> None:
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            for seed, payload in enumerate(payloads, start=300):
                _, record = await debate(session, seed, [("solver", payload), ("verifier", "VERDICT: CORRECT"),
                                                         ("judge", payload)])
                assert record.turns[0].reward == 0.0

    run(main())
    assert not target.exists()
