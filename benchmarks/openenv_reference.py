"""The baseline server for ``env_throughput.py``: the same debate environment served by the
OpenEnv reference stack (``create_app``: one WebSocket ``/ws`` per session, one
``Environment`` instance per session).

The same module runs under OpenEnv 0.10 (the ``openenv`` distribution; ``env_throughput.py``'s
``openenv010``, the baseline, from its own cached virtual environment) and under openenv-core
0.3.0 (``openenv030``, this environment's); both install the import package ``openenv`` with
the same ``create_app(env, action_cls, observation_cls, env_name=, max_concurrent_envs=)``.
It is deployed as OpenEnv 0.10's environment template deploys ``server/app.py``: ``uvicorn
<module>:app``, one process.

The environment reuses mathdebate's debate state machine (``env_server.debate.episode``), problem
sources and grading pool, so the two servers differ only in the serving stack. As OpenEnv has no
delayed-reward channel, a step that needs a grade awaits it before answering (the usual OpenEnv
pattern: the reward rides on the observation).

Run: ``uvicorn benchmarks.openenv_reference:app`` with ``MATHDEBATE_REF_PROBLEMS`` (problem
source, default built-in), ``MATHDEBATE_REF_WORKERS`` (grading workers) and
``MATHDEBATE_REF_MAX_ENVS`` (``max_concurrent_envs``, default 20,000).
"""

from __future__ import annotations

import os
import random
import uuid
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import load_problem_source
from env_server.grading.pool import Grader, GradingConfig
from env_server.protocol.models import DebateAction

MAX_ROUNDS = 2
MAX_ACTION_CHARS = 32_768


class DebateStepAction(Action):
    """The acting role's message."""

    role: str
    content: str


class DebateStepObservation(Observation):
    """Who acts next and what they see (the fields mathdebate's observation carries)."""

    episode_id: str
    problem_id: str
    role: str | None
    t: int
    round: int
    max_rounds: int
    messages: list[dict[str, str]]
    transcript: list[dict[str, Any]]


class ReferenceDebateEnvironment(Environment):
    """One debate per instance; shares the process-wide problem source and grader."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    problems = load_problem_source(os.environ.get("MATHDEBATE_REF_PROBLEMS") or None)
    grader: Grader | None = None

    def __init__(self) -> None:
        super().__init__()
        self.episode: DebateEpisode | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, problem_id: str | None = None,
              **kwargs: Any) -> DebateStepObservation:
        if problem_id is not None:
            problem = self.problems.get(problem_id)
        else:
            problem = self.problems.by_seed(seed if seed is not None else random.randrange(2**31))
        self.episode = DebateEpisode(episode_id or uuid.uuid4().hex, problem, MAX_ROUNDS, MAX_ACTION_CHARS)
        return self._observation(None)

    def step(self, action: DebateStepAction, timeout_s: float | None = None, **kwargs: Any) -> DebateStepObservation:
        raise NotImplementedError("served through step_async")

    async def step_async(self, action: DebateStepAction, timeout_s: float | None = None,
                         **kwargs: Any) -> DebateStepObservation:
        assert self.episode is not None, "reset first"
        turn = self.episode.step(DebateAction(role=action.role, content=action.content))
        reward = None
        if turn.needs_grade:
            grader = await _grader()
            grade = await grader.grade(self.episode.problem.answer, turn.answer)
            reward = float(grade.correct)
        return self._observation(reward)

    @property
    def state(self) -> State:
        if self.episode is None:
            return State(episode_id=None, step_count=0)
        return State(episode_id=self.episode.episode_id, step_count=self.episode.step_count)

    def _observation(self, reward: float | None) -> DebateStepObservation:
        episode = self.episode
        assert episode is not None
        return DebateStepObservation(
            episode_id=episode.episode_id, problem_id=episode.problem.problem_id,
            role=episode.role.value if episode.role else None, t=len(episode.turns), round=episode.round,
            max_rounds=episode.max_rounds, messages=episode._messages(),
            transcript=[{"t": t.t, "role": t.role.value, "round": t.round, "content": t.content}
                        for t in episode.turns],
            done=episode.done, reward=reward,
        )


async def _grader() -> Grader:
    if ReferenceDebateEnvironment.grader is None:
        workers = int(os.environ.get("MATHDEBATE_REF_WORKERS") or os.cpu_count() or 1)
        grader = Grader(GradingConfig(workers=workers))
        ReferenceDebateEnvironment.grader = grader
        await grader.start()
    return ReferenceDebateEnvironment.grader


app = create_app(ReferenceDebateEnvironment, DebateStepAction, DebateStepObservation, env_name="mathdebate-reference",
                 max_concurrent_envs=int(os.environ.get("MATHDEBATE_REF_MAX_ENVS", "20000")))


@app.on_event("startup")
async def _start_grader() -> None:
    await _grader()
