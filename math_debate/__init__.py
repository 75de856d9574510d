"""The debate as a verifiers environment package (verifiers 0.4, ``verifiers.v1``): each task is a
problem, each episode one debate on the env server, each turn of it a rollout of the seat whose
turn it is (``solver``, ``verifier``, ``judge``), and every reward the server's.

verifiers finds an environment by the name of its package: this one is ``math-debate``::

    vf-eval math-debate --env.url http://127.0.0.1:8000 \\
        --env.taskset.problems gen:single_digit_sum --env.taskset.limit 20 \\
        --model tiny --client.base-url http://127.0.0.1:8001/v1 --sampling.temperature 0 \\
        --sampling.max-tokens 256 --no-push

or from Python, :func:`load_environment` (the ``verifiers`` extra installs verifiers 0.4.0).

- Tasks: problem ``i`` is ``problems.by_seed(seed + i)`` of the problem source ``problems``
  (``gen:<family>``, a JSONL file, ``hf:<dataset>``), the problems and order of
  ``mathdebate eval --problems P --seed S --limit N``. The server at ``url`` must serve the same
  source (it refuses an unknown problem id). A task carries the problem's id, never its answer.
- Turns: each turn's prompt is the role's chat exactly as the server built it
  (``observation.messages``: the role's system prompt, the problem, the debate so far), sent
  through the seat's harness (by default verifiers' tool-less chat loop, ``null``, in a local
  subprocess) to the seat's model; the reply's text is the role's action. This is what
  ``mathdebate eval --policy openai:URL#MODEL`` sends, so the two play the same debates greedily.
  A blank reply, or one the server refuses, is submitted as
  :data:`~trainer_client.rollout.tools.FORFEIT_ACTION` (the server records a missing answer or
  verdict), as the eval does.
- Rewards: the server grades the debate; when its record arrives each turn's trace gets the
  server's reward ``reward`` (``episode``: the debate's ``episode_reward``, the default;
  ``turn``: that turn's own graded reward, per-role credit) and metrics from the same record
  (``turn_reward``, ``first_answer_correct``, ``final_answer_correct``, ``verifier_accepted``,
  ``rounds``); ``trace.info`` names the server's episode, the turn ``t`` and the problem. Nothing is
  graded here. The judge's seat is not trainable (``agents.judge.trainable = False``), as the
  trainer's reward shaping leaves judge turns out.
- Failures, in verifiers' error form: a model call that fails ends its turn's trace with an
  error, and the episode is recorded with the error (``episode.errors``; ``vf-eval --resume``
  plays it again); so is a debate the server cannot finish (a server gone past the reconnect
  budget with no replica, no graded record in time). Within the budget the client's own recovery
  applies (:class:`~env_server.client.replicas.ReplicaPool`: a server restarted on
  ``--state-dir`` is re-attached and the debate goes on). Nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import verifiers.v1 as vf
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.runtimes import SubprocessConfig
from verifiers.v1.utils.loaders import load_environment as _vf_load_environment

from env_server.client import GRADED_EPISODE_WAIT_S, MuxError
from env_server.client.replicas import ReplicaPool
from env_server.debate.problems import load_problem_source
from env_server.protocol.models import EpisodeRewards
from trainer_client.rollout.tools import FORFEIT_ACTION

__all__ = [
    "TASKSET_ID",
    "DebateEnv",
    "DebateEnvConfig",
    "DebateTask",
    "DebateTaskData",
    "DebateTaskset",
    "DebateTasksetConfig",
    "load_environment",
]

#: The taskset id: verifiers imports an environment package by its top-level name, reading ``-`` as ``_``.
TASKSET_ID = "math-debate"

#: Seconds a session's server may stay unreachable before the debate fails (a server restarted on
#: ``--state-dir`` within it is re-attached).
RECONNECT_BUDGET_S = 30.0


class DebateTasksetConfig(vf.TasksetConfig):
    """Which problems: ``problems.by_seed(seed + i)`` for ``i < limit``, as ``mathdebate eval``."""

    problems: str = "gen:single_digit_sum"
    """The problem source the server serves: ``gen:<family>[,...]``, a JSONL file, ``hf:<dataset>``."""
    seed: int = 0
    """Seed of the first problem."""
    limit: int = 100
    """How many problems."""


class DebateTaskData(vf.TaskData):
    """One problem: its id on the server (never its answer)."""

    problem_id: str


class DebateTask(vf.Task[DebateTaskData]):
    """A problem to debate."""


class DebateTurnData(vf.TaskData):
    """One turn of a debate: the role's chat as the server built it (``prompt``)."""

    problem_id: str
    episode_id: str
    t: int
    role: str


class DebateTurnTask(vf.Task[DebateTurnData]):
    """A turn, played by one rollout of the seat of ``role``."""


class DebateTaskset(vf.Taskset[DebateTask, DebateTasksetConfig]):
    """The problems of ``problems`` in ``mathdebate eval``'s order.

    Raises (on iteration):
        ValueError / OSError: a ``problems`` that cannot be read (env_server's message).
    """

    def load(self) -> Iterator[DebateTask]:
        source = load_problem_source(None if self.config.problems in ("", "builtin") else self.config.problems)
        for i in range(self.config.limit):
            problem = source.by_seed(self.config.seed + i)
            yield DebateTask(DebateTaskData(id=problem.problem_id, name=problem.problem_id,
                                            problem_id=problem.problem_id), self.config.task)


def _seat(harness: str = "null") -> vf.AgentConfig:
    # verifiers' default seat is the `bash` harness in a Prime sandbox; a debate turn is plain chat
    return vf.AgentConfig(harness=HarnessConfig(id=harness), runtime=SubprocessConfig())


class DebateEnvConfig(vf.EnvConfig):
    """The three seats and the env server. Each seat's model, client and sampling default to the
    run's (``--model``, ``--client.*``, ``--sampling.*``); ``--env.<seat>.model`` and the like
    give a role its own."""

    solver: vf.AgentConfig = _seat()
    verifier: vf.AgentConfig = _seat()
    judge: vf.AgentConfig = _seat()
    url: str = "http://127.0.0.1:8000"
    """The env server (``http://host:port``), or several replicas comma-separated."""
    max_rounds: int | None = None
    """Solver/verifier rounds of each debate; ``None``: the server's default."""
    reward: Literal["episode", "turn"] = "episode"
    """Each turn's reward: the debate's ``episode_reward``, or that turn's own graded reward."""
    reconnect_budget_s: float = RECONNECT_BUDGET_S
    """Seconds a server may stay unreachable before its debates fail."""


class DebateEnv(vf.Env[DebateEnvConfig]):
    """One debate per episode (see the module docstring)."""

    def __init__(self, config: DebateEnvConfig) -> None:
        super().__init__(config)
        self._pool: ReplicaPool | None = None
        self._pool_lock = asyncio.Lock()

    async def setup(self, agents: vf.Agents) -> None:
        agents.judge.trainable = False  # judge turns carry no credit (the trainer's shaping excludes them)

    async def start(self) -> None:
        await self._replicas()

    async def stop(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _replicas(self) -> ReplicaPool:
        async with self._pool_lock:
            if self._pool is None:
                self._pool = ReplicaPool(self.config.url, reconnect_budget_s=self.config.reconnect_budget_s)
            return self._pool

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        data: DebateTaskData = task.data
        pool = await self._replicas()
        session = await pool.open_session()
        played: list[tuple[int, vf.Trace]] = []
        try:
            result = await session.reset(problem_id=data.problem_id, max_rounds=self.config.max_rounds)
            episode_id = result.observation.episode_id
            while not result.done:
                observation = result.observation
                role = observation.role
                assert role is not None, "a debate that is not done has a role to play"
                turn = DebateTurnTask(DebateTurnData(
                    id=f"{episode_id}/{observation.t}", name=f"{data.problem_id} t={observation.t} {role.value}",
                    prompt=[{"role": m.role, "content": m.content} for m in observation.messages],
                    problem_id=data.problem_id, episode_id=episode_id, t=observation.t, role=role.value))
                trace = await getattr(agents, role.value).run(turn)
                played.append((observation.t, trace))
                if not trace.ok:  # the model call failed: not an answer; the episode carries the error
                    error = trace.last_error
                    raise RuntimeError(f"turn {observation.t} ({role.value}) of debate {episode_id} failed: "
                                       f"{error.type + ': ' + error.message if error else 'no reply'}")
                action = trace.last_reply or FORFEIT_ACTION
                try:
                    result = await session.step(role, action)
                except MuxError as exc:
                    if exc.code != "INVALID_ACTION":
                        raise
                    trace.info["forfeit"] = f"rejected: {exc}"
                    result = await session.step(role, FORFEIT_ACTION)
            record = await session.rewards(wait=True, timeout_s=GRADED_EPISODE_WAIT_S)
            if record is None:
                raise TimeoutError(f"no graded record for debate {episode_id} within {GRADED_EPISODE_WAIT_S:.0f} s")
        finally:
            # a server gone mid-debate fails close too: the debate's own error is the one to record
            with contextlib.suppress(ConnectionError, MuxError, OSError):
                await session.close()
        self._record(played, record)

    def _record(self, played: list[tuple[int, vf.Trace]], record: EpisodeRewards) -> None:
        """The server's record on each turn's trace (see the module docstring)."""
        by_t = {turn.t: turn for turn in record.turns}
        facts = record.facts
        for t, trace in played:
            turn_reward = by_t[t].reward
            trace.record_reward("reward", record.episode_reward if self.config.reward == "episode" else turn_reward)
            trace.record_metric("turn_reward", turn_reward)
            trace.record_metric("episode_reward", record.episode_reward)
            trace.record_metric("first_answer_correct", float(facts.first_answer_correct))
            trace.record_metric("final_answer_correct", float(facts.final_answer_correct))
            if facts.verifier_accepted is not None:
                trace.record_metric("verifier_accepted", float(facts.verifier_accepted))
            trace.record_metric("rounds", float(facts.rounds))
            trace.info.update(server_episode_id=record.episode_id, t=t, role=by_t[t].role.value,
                              problem_id=record.problem_id, answer=by_t[t].answer, correct=by_t[t].correct)


def load_environment(url: str = "http://127.0.0.1:8000", problems: str = "gen:single_digit_sum", limit: int = 100,
                     seed: int = 0, max_rounds: int | None = None, reward: Literal["episode", "turn"] = "episode",
                     **env: Any) -> DebateEnv:
    """The debate environment, built through verifiers' own loader.

    Args:
        url: the env server (or replicas, comma-separated).
        problems, limit, seed: the tasks (:class:`DebateTasksetConfig`).
        max_rounds: rounds per debate (``None``: the server's).
        reward: ``"episode"`` or ``"turn"`` (:class:`DebateEnvConfig`).
        **env: further :class:`DebateEnvConfig` fields (a seat's ``vf.AgentConfig``, ``retries``, ...).

    Returns:
        The :class:`DebateEnv` (``env.taskset`` iterates the tasks; ``vf-eval`` and prime-rl run it).

    Raises:
        pydantic.ValidationError: a setting of the wrong type or an unknown one.
    """
    config = DebateEnvConfig(taskset=DebateTasksetConfig(id=TASKSET_ID, problems=problems, limit=limit, seed=seed),
                             url=url, max_rounds=max_rounds, reward=reward, **env)
    environment = _vf_load_environment(config)
    assert isinstance(environment, DebateEnv)
    return environment
