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
was right.

Failures (``docs/failures.md``). A model request that fails for good (the policy's client has
retried: an HTTP error, a timeout, a dropped connection, a malformed reply) is not an answer:
its episode stops there, unplayed and ungraded, and is *failed* (:attr:`PlayedEpisode.failure`,
typed, with the server's own message); so is an episode the env server could not finish (a lost
session, no rewards record in time). A problem with a failed episode is a failed problem: it is
left out of every accuracy (best-of-N over fewer samples would be another measurement), never
counted as wrong. A forfeit that is the model's own doing is scored by the environment's rules
and counted apart (:attr:`PlayedTurn.forfeit`): a blank reply or a tool call the role's tool
does not take (the placeholder ``(no response)`` is submitted, which the server marks as a
missing answer or verdict), or an action the server refuses (``rejected``: the same
placeholder). The run goes on either way; :class:`EvalTotals` counts the requests and failures.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from env_server.client import GRADED_EPISODE_WAIT_S, MuxClient, MuxError
from env_server.client.failures import FailureTally, RequestFailure, first_lines
from env_server.debate.answers import parse_verdict
from env_server.debate.problems import Problem
from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.evaluation.policies import Policy, TurnReply, TurnRequest
from trainer_client.evaluation.selection import best_of_n_choice, self_consistency_choice

__all__ = ["EvalSettings", "EvalTotals", "PlayedEpisode", "PlayedTurn", "ProblemResult", "evaluate_problems",
           "final_answer_of"]

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

    ``forfeit`` says why the placeholder action was submitted, or ``None``: the model's own
    doing (scored): ``"blank"`` (no text), ``"invalid_tool_call"`` (a call the role's tool does
    not take, and no text), ``"rejected"`` (the server refused the action; ``error`` has its
    message); or ``"request_failed"``: the model request failed, nothing was submitted and the
    episode stopped there (failed, not scored).
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
    """One episode of a problem: its turns, the server's record and (best-of-N) its score.

    ``failure`` is set when the episode failed (a model request failed for good, or the env
    server could not finish it): it is then not scored.
    """

    sample: int
    episode_id: str | None = None
    turns: list[PlayedTurn] = field(default_factory=list)
    record: EpisodeRewards | None = None
    score: float | None = None
    score_source: str | None = None
    failure: RequestFailure | None = None

    @property
    def scored(self) -> bool:
        """Whether the server graded the episode and nothing failed (its outcome counts)."""
        return self.failure is None and self.record is not None

    @property
    def correct(self) -> bool:
        """The server's outcome: ``episode_reward == 1`` (``False`` for a failed episode, which
        is never counted: see :attr:`scored`)."""
        return self.scored and self.record is not None and self.record.episode_reward == 1.0


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
    def failure(self) -> RequestFailure | None:
        """The first failure among the problem's episodes (``None``: every episode was scored)."""
        return next((e.failure for e in self.episodes if e.failure is not None), None)

    @property
    def scored(self) -> bool:
        """Whether every episode of the problem was scored (a failed problem counts nowhere)."""
        return all(e.scored for e in self.episodes)

    @property
    def correct(self) -> bool:
        return self.scored and self.chosen_episode.correct

    @property
    def pass_at_n(self) -> bool:
        return self.scored and any(e.correct for e in self.episodes)


@dataclass
class EvalTotals:
    """What a run counted.

    Attributes:
        counters: ``turns``, ``requests_failed``, ``actions_rejected``, ``episodes_failed``,
            ``verifier_draws``, ``scoring_episodes``.
        requests: every policy request (verifier draws and scoring turns included) and its
            failures by reason (:class:`~env_server.client.failures.FailureTally`).
        env: one request per episode (its session on the env server) and the episodes the
            server could not finish.
        forfeits: the model's own forfeits by kind (``blank``, ``invalid_tool_call``, ``rejected``).
    """

    counters: dict[str, int]
    requests: FailureTally
    env: FailureTally
    forfeits: dict[str, int]


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
        self.requests, self.env = FailureTally(), FailureTally()
        self.forfeits: Counter[str] = Counter()
        self.reward_runner = reward_runner
        self.gate = asyncio.Semaphore(max(1, settings.concurrency))

    def _temperature(self, role: Role) -> float:
        if self.settings.strategy == "greedy" or role is Role.SOLVER:
            return self.settings.temperature
        return 0.0

    async def _ask(self, request: TurnRequest) -> TurnReply:
        """The policy's reply, counted; a failed request is counted with its typed reason."""
        reply = await self.policies[request.role].act(request)
        self.requests.request()
        if reply.content is None:
            if reply.failure is None:  # a policy that did not type its failure
                reply.failure = RequestFailure("request_error", first_lines(reply.error or "the policy gave no reply"))
            self.counters["requests_failed"] += 1
            self.requests.fail(reply.failure)
        return reply

    def _action(self, reply: TurnReply) -> tuple[str, str | None]:
        """``(action, forfeit)`` of a reply that came back: its text, or the placeholder for
        the model's own blank answer (counted in :attr:`forfeits`)."""
        from trainer_client.rollout.tools import FORFEIT_ACTION

        assert reply.content is not None, "failed requests never reach the env server"
        if reply.content.strip() and reply.content != FORFEIT_ACTION:
            return reply.content, None
        forfeit = reply.forfeit or "blank"
        self.forfeits[forfeit] += 1
        return FORFEIT_ACTION, forfeit

    def _wants_score(self, request_role: Role, t: int) -> bool:
        s = self.settings
        return (s.strategy == "best_of_n" and s.select == "verifier" and s.mode == "debate"
                and request_role is Role.VERIFIER and t == 1)

    async def play(self, problem: Problem, sample: int) -> PlayedEpisode:
        from trainer_client.rollout.tools import FORFEIT_ACTION

        episode = PlayedEpisode(sample)
        key = f"{problem.problem_id}#{sample}"
        async with self.gate:
            self.env.request()
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
                    reply = await self._ask(request)
                    if reply.failure is not None:  # not an answer: the episode stops here, unscored
                        episode.failure = reply.failure
                        episode.turns.append(PlayedTurn(observation.t, role, observation.round, "",
                                                        self.policies[role].spec, reply, "request_failed",
                                                        reply.failure.describe()))
                        break
                    content, forfeit = self._action(reply)
                    turn = PlayedTurn(observation.t, role, observation.round, content, self.policies[role].spec, reply,
                                      forfeit)
                    episode.turns.append(turn)
                    if wants_score:
                        episode.score, episode.score_source = await self._verifier_score(episode, request, reply)
                        if episode.failure is not None:
                            break
                    try:
                        result = await session.step(role, content)
                    except MuxError as exc:
                        if exc.code != "INVALID_ACTION":
                            raise
                        self.counters["actions_rejected"] += 1
                        self.forfeits["rejected"] += 1
                        turn.content, turn.forfeit, turn.error = FORFEIT_ACTION, "rejected", str(exc)
                        result = await session.step(role, FORFEIT_ACTION)
                    self.counters["turns"] += 1
                if episode.failure is None:
                    episode.record = await session.rewards(wait=True, timeout_s=GRADED_EPISODE_WAIT_S)
                    if episode.record is None:
                        self._env_failed(episode, RequestFailure(
                            "env_rewards_timeout", f"no rewards record for episode {episode.episode_id} within "
                                                   f"{GRADED_EPISODE_WAIT_S:.0f} s"))
            except MuxError as exc:
                if exc.code == "UNKNOWN_PROBLEM":
                    raise RuntimeError("the server serves another problem set: give `eval` the same --problems "
                                       "as the server at --env-url") from exc
                self._env_failed(episode, RequestFailure(f"env_{exc.code.lower()}", first_lines(str(exc))))
            finally:
                for policy in set(self.policies.values()):
                    policy.episode_done(key)
                await _close_quietly(session)
            if (episode.failure is None and self.settings.strategy == "best_of_n"
                    and self.settings.select == "verifier" and self.settings.mode == "single"):
                episode.score, episode.score_source = await self._single_mode_score(problem, episode, key)
            if episode.failure is not None:
                self.counters["episodes_failed"] += 1
        return episode

    def _env_failed(self, episode: PlayedEpisode, failure: RequestFailure) -> None:
        """The env server could not finish ``episode``: it fails (counted per episode)."""
        episode.failure = episode.failure or failure
        self.env.fail(failure)

    async def _verifier_score(self, episode: PlayedEpisode, request: TurnRequest,
                              reply: TurnReply) -> tuple[float | None, str]:
        if reply.accept_prob is not None:
            return reply.accept_prob, "logprobs"
        verdicts = [parse_verdict(reply.content or "")]
        for draw in range(1, max(1, self.settings.verifier_samples)):
            extra = await self._ask(TurnRequest(Role.VERIFIER, request.observation, request.episode_key, 1.0, draw))
            self.counters["verifier_draws"] += 1
            if extra.failure is not None:  # a draw that failed is no vote: the episode fails
                episode.failure = extra.failure
                return None, "request_failed"
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
            reply = await self._ask(request)
            if reply.failure is not None:
                episode.failure = reply.failure
                return None, "request_failed"
            return await self._verifier_score(episode, request, reply)
        except MuxError as exc:
            self._env_failed(episode, RequestFailure(f"env_{exc.code.lower()}",
                                                     first_lines(f"scoring episode: {exc}")))
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
        if not result.scored:  # a failed problem: nothing to choose among (it is counted nowhere)
            return result
        if self.settings.strategy == "best_of_n":
            if self.settings.select != "verifier":
                await self.reward_scores(problem, episodes)
            result.chosen = best_of_n_choice([e.score for e in episodes])
        elif self.settings.strategy == "self_consistency":
            from trainer_client.evaluation.heldout import grade_answer_text

            answers = [final_answer_of(e.record) for e in episodes]
            result.chosen, result.votes = self_consistency_choice(answers, grade_answer_text)
        return result


async def _close_quietly(session: Any) -> None:
    with contextlib.suppress(MuxError, ConnectionError, asyncio.TimeoutError):
        await session.close()


async def evaluate_problems(url: str, problems: Sequence[Problem], policies: dict[Role, Policy], settings: EvalSettings,
                            *, token: str | None = None, progress: bool = True,
                            reward_function: str | None = None) -> tuple[list[ProblemResult], EvalTotals]:
    """Play every problem under the strategy; return the per-problem results (in order) and what
    the run counted (:class:`EvalTotals`: its counters, requests and failures, forfeits).

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
    correct = scored = failed = 0

    async def one(i: int, problem: Problem) -> None:
        nonlocal correct, scored, failed
        result = results[i] = await run.problem(problem)
        correct, scored, failed = correct + result.correct, scored + result.scored, failed + (not result.scored)
        bar.update(1)
        bar.set_postfix(acc=f"{correct / scored:.3f}" if scored else "-", failed=failed, refresh=False)

    try:
        await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    finally:
        bar.close()
        await client.close()
        if runner is not None:
            runner.close()
    return [r for r in results if r is not None], EvalTotals(dict(counters), run.requests, run.env, dict(run.forfeits))
