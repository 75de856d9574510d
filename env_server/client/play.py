"""``mathdebate play``: drive N concurrent debates over ``/ws/mux`` with a scripted policy.

Policies (all three roles are scripted):

- ``reference``: the solver answers with the problem's reference solution; the verifier accepts
  it; the judge boxes the solver's last answer. Every episode should be correct.
- ``noisy``: the solver answers wrong with probability ``p`` (another problem's answer) and
  omits the box with probability ``p/10``; the verifier recognises a wrong answer but errs with
  probability ``p/2``; a rejected solver retries with a fresh draw; the judge boxes the
  solver's last answer.

The driver knows the problems (it loads the same source as the server) and starts each episode
with ``reset(problem_id=...)``; it reports accuracy, per-role rewards, error kinds, throughput
and step latency. With ``mode="single"`` every episode is the solver's one answer (RFC 0006).

An episode the env server could not finish (no rewards record in time, its replica lost past
every replay, a protocol error) is *failed*: it is left out of the accuracy and counted with a
typed reason and the server's message (:class:`PlayReport` ``failures``, a
:class:`~env_server.client.failures.FailureTally` over the episodes: each episode is one request
to the environment). ``mathdebate play`` exits 3 when more than ``--max-failed-share`` of them
failed (``docs/failures.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from env_server.client import GRADED_EPISODE_WAIT_S, MuxError, MuxSession, SessionLostError
from env_server.client.failures import FailureTally, RequestFailure, first_lines
from env_server.client.replicas import NoReplicaError, ReplicaPool
from env_server.debate.answers import final_answer
from env_server.debate.problems import Problem, ProblemSource
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation, EpisodeRewards

__all__ = ["PlayReport", "ScriptedDebaters", "play"]

Policy = Literal["reference", "noisy"]


class ScriptedDebaters:
    """Rule-based solver, verifier and judge.

    Args:
        policy: ``"reference"`` or ``"noisy"``.
        p: error probability of the noisy policy, in [0, 1].
        problems: the problem source (wrong answers are drawn from other problems).
        rng: randomness (seeded by the caller for reproducible runs).
    """

    def __init__(self, policy: Policy, p: float, problems: ProblemSource, rng: random.Random) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.policy = policy
        self.p = p if policy == "noisy" else 0.0
        self.problems = problems
        self.rng = rng

    def _wrong_answer(self, problem: Problem) -> str:
        for _ in range(20):
            other = self.problems.by_seed(self.rng.randrange(len(self.problems))).answer
            if other.replace(" ", "") != problem.answer.replace(" ", ""):
                return other
        return f"{problem.answer}+1"

    def solver(self, problem: Problem) -> tuple[str, bool]:
        """(response, whether it is meant to be correct)."""
        draw = self.rng.random()
        if draw < self.p / 10:
            return "I could not finish the computation.", False
        if draw < self.p:
            return f"Working through the problem carefully, the answer is $\\boxed{{{self._wrong_answer(problem)}}}$.", False
        return problem.solution, True

    def verifier(self, believed_correct: bool) -> str:
        says_correct = believed_correct if self.rng.random() >= self.p / 2 else not believed_correct
        if says_correct:
            return "I checked every step and the final answer.\nVERDICT: CORRECT"
        return "The final answer does not follow from the problem; recheck the computation.\nVERDICT: INCORRECT"

    @staticmethod
    def judge(observation: DebateObservation) -> str:
        solver_turns = [t for t in observation.transcript if t.role is Role.SOLVER]
        answer = final_answer(solver_turns[-1].content) if solver_turns else None
        if answer is None:
            return "No answer was given in the debate."
        return f"Having read the debate, the final answer is $\\boxed{{{answer}}}$."


@dataclass
class PlayReport:
    """Aggregates of a play run: graded episodes only (``episodes``, accuracy, rewards), and
    the failed ones apart (``failed``, ``errors`` by code, ``failures``: one request per episode
    attempted, each failure typed with its message)."""

    episodes: int = 0
    failed: int = 0
    steps: int = 0
    seconds: float = 0.0
    episode_reward: float = 0.0
    first_answer_correct: int = 0
    judge_correct: int = 0
    judge_answered: int = 0
    role_rewards: dict[str, list[float]] = field(default_factory=lambda: {r.value: [] for r in Role})
    error_kinds: Counter[str] = field(default_factory=Counter)
    step_latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    #: episodes played again from the start on another replica after theirs was lost
    reruns: int = 0
    #: episodes per replica URL (where each graded episode was played)
    per_replica: Counter[str] = field(default_factory=Counter)
    #: every episode attempted (one request each) and the failed ones, typed with their message
    failures: FailureTally = field(default_factory=FailureTally)

    def fail(self, code: str, failure: RequestFailure) -> None:
        """Count a failed episode (not scored) under ``code`` and its typed ``failure``."""
        self.failed += 1
        self.errors[code] += 1
        self.failures.fail(failure)

    def add(self, record: EpisodeRewards) -> None:
        self.episodes += 1
        self.episode_reward += record.episode_reward
        self.first_answer_correct += int(record.facts.first_answer_correct)
        if record.facts.judge_correct is not None:
            self.judge_answered += 1
            self.judge_correct += int(record.facts.judge_correct)
        for turn in record.turns:
            self.role_rewards[turn.role.value].append(turn.reward)
            if turn.error_kind is not None:
                self.error_kinds[turn.error_kind.value] += 1

    @property
    def accuracy(self) -> float:
        return self.episode_reward / self.episodes if self.episodes else 0.0

    def latency_ms(self, q: float) -> float:
        if not self.step_latencies:
            return 0.0
        ordered = sorted(self.step_latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> dict[str, object]:
        """A flat dict of the headline figures (for the final JSON line)."""
        return {
            "episodes": self.episodes,
            "failed": self.failed,
            "accuracy": round(self.accuracy, 4),
            "first_answer_accuracy": round(self.first_answer_correct / self.episodes, 4) if self.episodes else 0.0,
            "judge_accuracy": round(self.judge_correct / self.judge_answered, 4) if self.judge_answered else None,
            **{f"reward/{role}": round(sum(v) / len(v), 4) if v else None for role, v in self.role_rewards.items()},
            "error_kinds": dict(self.error_kinds),
            "steps_per_s": round(self.steps / self.seconds, 1) if self.seconds else 0.0,
            "step_p50_ms": round(self.latency_ms(0.50), 2),
            "step_p99_ms": round(self.latency_ms(0.99), 2),
            "reruns": self.reruns,
            "per_replica": dict(self.per_replica),
            "failures": self.failures.summary(),
        }


#: times one episode is played again elsewhere before it counts as failed
MAX_REPLAYS = 3


async def _play_episode(session: MuxSession, debaters: ScriptedDebaters, problem: Problem, report: PlayReport,
                        max_rounds: int | None, mode: str | None = None) -> bool:
    """Play one episode on ``session`` (a reset starts it, as in OpenEnv). Returns whether it
    was graded (``False``: its record did not arrive in time, counted in ``report.errors``)."""
    result = await session.reset(problem_id=problem.problem_id, max_rounds=max_rounds, mode=mode)
    believed_correct = False
    loop = asyncio.get_running_loop()
    while not result.done:
        role = result.observation.role
        assert role is not None, "a debate that is not done has a role to play"
        if role is Role.SOLVER:
            content, believed_correct = debaters.solver(problem)
        elif role is Role.VERIFIER:
            content = debaters.verifier(believed_correct)
        else:
            content = debaters.judge(result.observation)
        start = loop.time()
        result = await session.step(role, content)
        report.step_latencies.append(loop.time() - start)
        report.steps += 1
    record = await session.rewards(wait=True, timeout_s=GRADED_EPISODE_WAIT_S)
    if record is None:
        report.fail("rewards_timeout", RequestFailure(
            "env_rewards_timeout", f"no rewards record for episode {session.episode_id} within "
                                   f"{GRADED_EPISODE_WAIT_S:.0f} s"))
        return False
    report.add(record)
    return True


async def play(url: str, problems: ProblemSource, episodes: int, concurrency: int, policy: Policy = "noisy",
               p: float = 0.3, seed: int = 0, connections: int = 1, token: str | None = None,
               max_rounds: int | None = None, progress: bool = True, mode: str | None = None,
               rerun_after_s: float = 30.0) -> PlayReport:
    """Play ``episodes`` debates, ``concurrency`` at a time, over ``connections`` connections
    per server.

    Args:
        url: server address (``http://host:port``), or several replicas comma-separated:
            each session goes to the least-loaded healthy one (``env_server.client.replicas``).
        problems: the same problem source the server serves.
        episodes: how many debates; problem ``i`` is ``problems.by_seed(seed + i)``.
        concurrency: debates in flight at once (each worker keeps one session for its episodes).
        policy, p: the scripted policy (see module docstring).
        seed: seeds problem choice and the policy's randomness.
        connections: WebSocket connections the sessions are spread over.
        token: bearer token, if the server requires one.
        max_rounds: per-episode override of the server's default.
        progress: show a tqdm progress bar.
        mode: ``"debate"`` or ``"single"`` for every episode (RFC 0006); ``None``: the
            server's default.
        rerun_after_s: how long a session's server may stay unreachable (the reconnect
            budget) before its episode is played again from the start on another replica
            (counted in ``reruns``); a session the server lost is re-run at once.

    Returns:
        The aggregated :class:`PlayReport`.
    """
    from tqdm import tqdm

    debaters = ScriptedDebaters(policy, p, problems, random.Random(seed))
    pools = [ReplicaPool(url, token, reconnect_budget_s=rerun_after_s) for _ in range(max(1, connections))]
    report = PlayReport()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(episodes):
        queue.put_nowait(i)
    bar = tqdm(total=episodes, desc=f"debates ({policy})", unit="ep", disable=not progress)

    async def worker(k: int) -> None:
        # Each worker keeps one session for all its episodes (a reset starts the next one, as
        # an OpenEnv client does) and opens a new one, on a healthy replica, when it is lost.
        pool = pools[k % len(pools)]
        session: MuxSession | None = None
        try:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                report.failures.request()
                try:
                    for attempt in range(MAX_REPLAYS + 1):
                        try:
                            if session is None:
                                session = await pool.open_session()
                            if await _play_episode(session, debaters, problems.by_seed(seed + i), report,
                                                   max_rounds, mode):
                                report.per_replica[pool.replica_of(session)] += 1
                            break
                        except NoReplicaError:
                            raise
                        except (SessionLostError, ConnectionError) as exc:  # its replica is gone: play it elsewhere
                            session = None
                            if attempt == MAX_REPLAYS:
                                report.fail("replica_lost", RequestFailure(
                                    "env_replica_lost", first_lines(f"{type(exc).__name__}: {exc}")))
                            else:
                                report.reruns += 1
                except MuxError as exc:
                    report.fail(exc.code, RequestFailure(f"env_{exc.code.lower()}", first_lines(str(exc))))
                    if exc.code == "UNKNOWN_PROBLEM":
                        raise RuntimeError(
                            "the server serves another problem set: give `play` the same --problems as `serve`"
                        ) from exc
                bar.update(1)
                bar.set_postfix(acc=f"{report.accuracy:.3f}", refresh=False)
        finally:
            if session is not None and session.lost is None and not session.client.reconnecting:
                with contextlib.suppress(ConnectionError, asyncio.TimeoutError, MuxError):
                    await session.close()

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker(k) for k in range(max(1, concurrency))))
    finally:
        report.seconds = time.perf_counter() - start
        bar.close()
        await asyncio.gather(*(pool.close() for pool in pools))
    return report
