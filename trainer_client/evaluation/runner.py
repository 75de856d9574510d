"""Evaluation episodes against the env server, for each strategy.

Every answer is graded by the server that serves the problems (its grader, its rewards record,
RFC 0003); this module only plays turns and chooses among samples. An episode's outcome is its
``episode_reward``: the correctness of its final answer (the solver's answer in ``single`` mode;
the judge's boxed answer, else the solver's last answer, in ``debate`` mode).

Strategies, per problem:

- ``greedy``: one episode; every role at ``temperature`` (default 0).
- ``best_of_n``: N episodes, the solver sampling at ``temperature`` (other roles greedy). Each
  is scored by ``select``:

  * ``verifier`` (default): the verifier policy's P(CORRECT) for the solver's first answer,
    from the verdict token's log-probabilities where the policy gives them (``hf:``, an
    ``openai:`` endpoint that returns logprobs), else the acceptance rate over K verifier
    draws (the episode's own verdict and K - 1 more at temperature 1 on the same observation).
    In ``debate`` mode the review is the episode's own first verifier turn (``t = 1``); in
    ``single`` mode, which has no verifier, the sample is submitted to a separate ``debate``
    episode on the same problem whose verifier observation is used, then that scoring
    session is closed unplayed (counted as ``scoring_episodes``);
  * ``reward:MODULE:FUNCTION``: a user reward function (``@reward_function``,
    :mod:`trainer_client.credit.reward_functions`) on the episode's messages (the problem as a user
    message, then each turn's action as an assistant message) with the problem's answer as
    ``ground_truth``; an invalid result scores ``None``.

  The highest score wins; ties go to the lowest sample index
  (:func:`~trainer_client.evaluation.selection.best_of_n_choice`).
- ``self_consistency``: N episodes as for best-of-N; majority vote over their final answers
  (:func:`~trainer_client.evaluation.selection.self_consistency_choice`, with the server's
  grader code as the equality).

The chosen episode's outcome is the problem's result; pass@N is whether any of the N episodes
was right. A turn whose model request failed is forfeited (the placeholder action
``(no response)``, which the server marks as a missing answer or verdict) and counted; an
action the server rejects is forfeited the same way. The run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from env_server.client import GRADED_EPISODE_WAIT_S, MuxClient, MuxError
from env_server.debate.answers import parse_verdict
from env_server.debate.problems import Problem
from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.evaluation.policies import Policy, TurnReply, TurnRequest
from trainer_client.evaluation.selection import best_of_n_choice, self_consistency_choice

__all__ = ["EvalSettings", "PlayedEpisode", "PlayedTurn", "ProblemResult", "evaluate_problems", "final_answer_of"]

Strategy = Literal["greedy", "best_of_n", "self_consistency"]


@dataclass(frozen=True)
class EvalSettings:
    """What to run.

    Attributes:
        mode: ``debate`` or ``single`` (RFC 0006).
        strategy: ``greedy``, ``best_of_n`` or ``self_consistency``.
        n: samples per problem (1 for greedy).
        temperature: the solver's sampling temperature (greedy: every role's).
        select: best-of-N's scorer: ``verifier`` or ``reward:MODULE:FUNCTION``.
        verifier_samples: K, verifier draws for the acceptance rate when no log-probabilities.
        max_rounds: the episodes' ``max_rounds`` (``None``: the server's default).
        concurrency: episodes in flight at once.
    """

    mode: str = "debate"
    strategy: Strategy = "greedy"
    n: int = 1
    temperature: float = 0.0
    select: str = "verifier"
    verifier_samples: int = 4
    max_rounds: int | None = None
    concurrency: int = 8


@dataclass
class PlayedTurn:
    """One turn as played: the server's ``t``/role/round, the submitted action and the policy's reply.

    ``forfeit`` is ``"request_failed"`` (the model call failed), ``"rejected"`` (the server
    refused the action; ``error`` has its message) or ``None``.
    """

    t: int
    role: Role
    round: int
    content: str
    policy: str
    reply: TurnReply
    forfeit: str | None = None
    error: str | None = None


@dataclass
class PlayedEpisode:
    """One episode of a problem: its turns, the server's record and (best-of-N) its score."""

    sample: int
    episode_id: str | None = None
    turns: list[PlayedTurn] = field(default_factory=list)
    record: EpisodeRewards | None = None
    score: float | None = None
    score_source: str | None = None
    error: str | None = None

    @property
    def correct(self) -> bool:
        """The server's outcome: ``episode_reward == 1`` (a failed episode is wrong)."""
        return self.record is not None and self.record.episode_reward == 1.0


@dataclass
class ProblemResult:
    """A problem's episodes, the chosen one and (self-consistency) its cluster's votes."""

    problem: Problem
    episodes: list[PlayedEpisode]
    chosen: int = 0
    votes: int | None = None

    @property
    def chosen_episode(self) -> PlayedEpisode:
        return self.episodes[self.chosen]

    @property
    def correct(self) -> bool:
        return self.chosen_episode.correct

    @property
    def pass_at_n(self) -> bool:
        return any(e.correct for e in self.episodes)


def final_answer_of(record: EpisodeRewards | None) -> str | None:
    """The answer an episode's outcome grades: the judge's boxed answer when it gave one,
    else the solver's last answer (``single`` mode: the solver's answer); ``None`` if none."""
    if record is None:
        return None
    judge = [t for t in record.turns if t.role is Role.JUDGE]
    if judge and judge[-1].answer is not None:
        return judge[-1].answer
    solver = [t for t in record.turns if t.role is Role.SOLVER]
    return solver[-1].answer if solver else None


class _Run:
    def __init__(self, client: MuxClient, policies: dict[Role, Policy], settings: EvalSettings,
                 counters: Counter[str], reward_runner: Any = None) -> None:
        self.client, self.policies, self.settings = client, policies, settings
        self.counters = counters
        self.reward_runner = reward_runner
        self.gate = asyncio.Semaphore(max(1, settings.concurrency))

    def _temperature(self, role: Role) -> float:
        if self.settings.strategy == "greedy" or role is Role.SOLVER:
            return self.settings.temperature
        return 0.0

    async def _act(self, episode: PlayedEpisode, request: TurnRequest) -> tuple[str, TurnReply, str | None]:
        from trainer_client.rollout.tools import FORFEIT_ACTION

        reply = await self.policies[request.role].act(request)
        if reply.content is None:
            self.counters["requests_failed"] += 1
            return FORFEIT_ACTION, reply, "request_failed"
        return reply.content, reply, None

    def _wants_score(self, request_role: Role, t: int) -> bool:
        s = self.settings
        return (s.strategy == "best_of_n" and s.select == "verifier" and s.mode == "debate"
                and request_role is Role.VERIFIER and t == 1)

    async def play(self, problem: Problem, sample: int) -> PlayedEpisode:
        from trainer_client.rollout.tools import FORFEIT_ACTION

        episode = PlayedEpisode(sample)
        key = f"{problem.problem_id}#{sample}"
        async with self.gate:
            session = await self.client.open_session()
            try:
                result = await session.reset(problem_id=problem.problem_id, max_rounds=self.settings.max_rounds,
                                             mode=self.settings.mode)
                episode.episode_id = result.observation.episode_id
                while not result.done:
                    observation = result.observation
                    role = observation.role
                    assert role is not None, "a debate that is not done has a role to play"
                    wants_score = self._wants_score(role, observation.t)
                    request = TurnRequest(role, observation, key, self._temperature(role), 0, wants_score)
                    content, reply, forfeit = await self._act(episode, request)
                    turn = PlayedTurn(observation.t, role, observation.round, content, self.policies[role].spec, reply,
                                      forfeit)
                    episode.turns.append(turn)
                    if wants_score:
                        episode.score, episode.score_source = await self._verifier_score(request, reply)
                    try:
                        result = await session.step(role, content)
                    except MuxError as exc:
                        if exc.code != "INVALID_ACTION":
                            raise
                        self.counters["actions_rejected"] += 1
                        turn.content, turn.forfeit, turn.error = FORFEIT_ACTION, "rejected", str(exc)
                        result = await session.step(role, FORFEIT_ACTION)
                    self.counters["turns"] += 1
                episode.record = await session.rewards(wait=True, timeout_s=GRADED_EPISODE_WAIT_S)
                if episode.record is None:
                    episode.error = "no rewards record in time"
            except MuxError as exc:
                if exc.code == "UNKNOWN_PROBLEM":
                    raise RuntimeError("the server serves another problem set: give `eval` the same --problems "
                                       "as the server at --env-url") from exc
                episode.error = str(exc)
            finally:
                for policy in set(self.policies.values()):
                    policy.episode_done(key)
                await _close_quietly(session)
            if episode.error is not None:
                self.counters["episodes_failed"] += 1
            if self.settings.strategy == "best_of_n" and self.settings.select == "verifier" and self.settings.mode == "single":
                episode.score, episode.score_source = await self._single_mode_score(problem, episode, key)
        return episode

    async def _verifier_score(self, request: TurnRequest, reply: TurnReply) -> tuple[float | None, str]:
        if reply.accept_prob is not None:
            return reply.accept_prob, "logprobs"
        verdicts = [parse_verdict(reply.content or "")]
        for draw in range(1, max(1, self.settings.verifier_samples)):
            extra = await self.policies[Role.VERIFIER].act(
                TurnRequest(Role.VERIFIER, request.observation, request.episode_key, 1.0, draw))
            self.counters["verifier_draws"] += 1
            verdicts.append(parse_verdict(extra.content or ""))
        return sum(v == "CORRECT" for v in verdicts) / len(verdicts), "acceptance_rate"

    async def _single_mode_score(self, problem: Problem, episode: PlayedEpisode, key: str) -> tuple[float | None, str]:
        solver = next((t for t in episode.turns if t.role is Role.SOLVER), None)
        if solver is None:
            return None, "none"
        scoring_key = f"{key}/score"
        session = await self.client.open_session()
        self.counters["scoring_episodes"] += 1
        try:
            await session.reset(problem_id=problem.problem_id, max_rounds=1, mode="debate")
            result = await session.step(Role.SOLVER, solver.content)
            request = TurnRequest(Role.VERIFIER, result.observation, scoring_key, 0.0, 0, True)
            reply = await self.policies[Role.VERIFIER].act(request)
            if reply.content is None:
                self.counters["requests_failed"] += 1
                return None, "request_failed"
            return await self._verifier_score(request, reply)
        except MuxError as exc:
            episode.error = episode.error or f"scoring episode: {exc}"
            return None, "none"
        finally:
            self.policies[Role.VERIFIER].episode_done(scoring_key)
            await _close_quietly(session)

    async def reward_scores(self, problem: Problem, episodes: Sequence[PlayedEpisode]) -> None:
        rollouts = [[{"role": "user", "content": problem.problem}]
                    + [{"role": "assistant", "content": t.content} for t in e.turns] for e in episodes]
        results = await asyncio.to_thread(self.reward_runner.evaluate, rollouts, [problem.answer] * len(rollouts))
        for episode, result in zip(episodes, results, strict=True):
            episode.score = result.score if result.is_score_valid else None
            episode.score_source = "reward_function"

    async def problem(self, problem: Problem) -> ProblemResult:
        n = 1 if self.settings.strategy == "greedy" else self.settings.n
        episodes = list(await asyncio.gather(*(self.play(problem, i) for i in range(n))))
        result = ProblemResult(problem, episodes)
        if self.settings.strategy == "best_of_n":
            if self.settings.select != "verifier":
                await self.reward_scores(problem, episodes)
            result.chosen = best_of_n_choice([e.score for e in episodes])
        elif self.settings.strategy == "self_consistency":
            from trainer_client.experiments.heldout import grade_answer_text

            answers = [final_answer_of(e.record) for e in episodes]
            result.chosen, result.votes = self_consistency_choice(answers, grade_answer_text)
        return result


async def _close_quietly(session: Any) -> None:
    with contextlib.suppress(MuxError, ConnectionError, asyncio.TimeoutError):
        await session.close()


async def evaluate_problems(url: str, problems: Sequence[Problem], policies: dict[Role, Policy], settings: EvalSettings,
                            *, token: str | None = None, progress: bool = True,
                            reward_function: str | None = None) -> tuple[list[ProblemResult], dict[str, int]]:
    """Play every problem under the strategy; return the per-problem results (in order) and the
    run's counters (``turns``, ``requests_failed``, ``actions_rejected``, ``episodes_failed``,
    ``verifier_draws``, ``scoring_episodes``).

    Args:
        url: the env server (``http://host:port``); one multiplexed connection carries every session.
        problems: the problems (the server must serve them: same ``--problems``).
        policies: a policy per role (roles a mode never plays may be absent).
        settings: mode, strategy, N, temperatures, concurrency.
        token: bearer token, if the server requires one.
        progress: a tqdm bar over problems.
        reward_function: ``MODULE:FUNCTION`` for ``select = reward:...``.

    Raises:
        RuntimeError: the server does not serve these problems.
        ValueError: a bad strategy/selection.
    """
    from tqdm import tqdm

    if settings.strategy not in ("greedy", "best_of_n", "self_consistency"):
        raise ValueError(f"unknown strategy {settings.strategy!r}")
    if settings.strategy != "greedy" and settings.n < 1:
        raise ValueError("--n must be at least 1")
    counters: Counter[str] = Counter()
    runner = None
    if settings.strategy == "best_of_n" and settings.select != "verifier":
        from trainer_client.credit.reward_functions import RewardFunctionRunner, load_reward_function

        runner = RewardFunctionRunner(load_reward_function(reward_function or settings.select.removeprefix("reward:")))
    client = MuxClient(url, token)
    await client.connect()
    run = _Run(client, policies, settings, counters, runner)
    bar = tqdm(total=len(problems), desc=f"eval {settings.strategy} ({settings.mode})", unit="problem",
               disable=not progress)
    results: list[ProblemResult | None] = [None] * len(problems)
    correct = done = 0

    async def one(i: int, problem: Problem) -> None:
        nonlocal correct, done
        result = results[i] = await run.problem(problem)
        correct, done = correct + result.correct, done + 1
        bar.update(1)
        bar.set_postfix(acc=f"{correct / done:.3f}", refresh=False)

    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    finally:
        bar.close()
        await client.close()
        if runner is not None:
            runner.close()
    return [r for r in results if r is not None], dict(counters)
