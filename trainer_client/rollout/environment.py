"""The ``environment_factory`` adapter: a debate session as a TRL environment.

TRL's contract (trl 1.16, ``GRPOTrainer(environment_factory=...)``): a zero-argument factory
returns an object with ``reset(**row) -> str | None`` (its string is appended to the last user
message of the prompt), optional ``get_reward() -> float``, and public methods with typed,
docstringed arguments that become the model's tools. Here:

- one instance = one session on the env server, opened over a **shared** multiplexed
  connection (one WebSocket per process and server, whatever the number of rollouts); with
  several servers (replicas: a list or a comma-separated string of URLs) each session is placed
  on the least-loaded healthy one (``env_server.client.replicas``);
- a restarted or unreachable server does not lose the episode: the client reconnects on its own
  and re-sends what was in flight (a server with ``--state-dir`` resumes the session); when the
  session is gone (a restart without state) or its replica stays down past the reconnect budget,
  the episode is re-run on another (or the restarted) replica on the same ``problem_id`` with
  the same actions, which the debate reproduces exactly, and counted (``reruns``);
- the tools are role-typed: ``submit_solution`` (solver), ``submit_verdict`` (verifier),
  ``submit_final_answer`` (judge); each returns the next role's instructions, rendered from the
  server's observation, or raises (TRL shows the model ``{"error": ...}``) when the server
  rejects the action;
- a rollout that ends without finishing the debate is finished by :meth:`_finish`: its last
  assistant message (when the trainer passes it) is submitted as the current role's action and
  the remaining turns are forfeited with placeholder actions, which the server marks
  (``missing_verdict``, ``missing_final_answer``). So models that never call tools still
  complete graded episodes;
- ``get_reward()`` finishes the episode if needed and waits (bounded) for the delayed rewards
  record.

Every non-tool method is private: TRL turns every public function into a tool. Trainers use the
one supported handle instead, :attr:`DebateEnvironment.trace` (an :class:`EpisodeTrace`: a
property, so TRL does not see it as a tool).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from env_server.client import GRADED_EPISODE_WAIT_S, MuxError, SessionLostError, StepResult, SyncMuxSession
from env_server.client.replicas import SyncReplicaPool, parse_urls
from env_server.protocol.markers import Role
from env_server.protocol.models import DebateObservation, EpisodeRewards, TurnReward
from trainer_client.rollout.sessions import SessionLedger
from trainer_client.rollout.tools import (
    _FORFEIT,
    DEBATE_OVER,
    TOOL_FOR_ROLE,
    action_content,
    render_instructions,
)
from trainer_client.rollout.trace import EpisodeTrace, TraceHandles, TurnLog

__all__ = ["DebateEnvironment", "environment_factory", "shared_client"]

log = logging.getLogger(__name__)

_CLIENTS: dict[tuple[tuple[str, ...], str | None], SyncReplicaPool] = {}
_CLIENTS_LOCK = threading.Lock()
#: how long a session's replica may stay unreachable before its episode is re-run elsewhere, s
RERUN_AFTER_S = 30.0


def shared_client(base_url: str | Sequence[str], token: str | None = None,
                  rerun_after_s: float = RERUN_AFTER_S) -> SyncReplicaPool:
    """The process-wide connections to the env server(s) ``base_url`` (one URL, a list, or a
    comma-separated string): one multiplexed connection per replica, created on first use.
    ``rerun_after_s`` is the reconnect budget of each connection (the first caller's wins)."""
    key = (tuple(parse_urls(base_url)), token)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = SyncReplicaPool(key[0], token, reconnect_budget_s=rerun_after_s)
        return client


class DebateEnvironment:
    """One debate session (see the module docstring). Use :func:`environment_factory` to bind
    a server; the class attributes below are its settings."""

    _base_url: ClassVar[str | tuple[str, ...]] = "http://127.0.0.1:8000"
    _token: ClassVar[str | None] = None
    _max_rounds: ClassVar[int | None] = None
    _mode: ClassVar[str | None] = None
    _rewards_timeout_s: ClassVar[float] = GRADED_EPISODE_WAIT_S
    _rerun_after_s: ClassVar[float] = RERUN_AFTER_S
    _ledger: ClassVar[SessionLedger | None] = None

    def __init__(self) -> None:
        self._client = shared_client(self._base_url, self._token, self._rerun_after_s)
        self._session: SyncMuxSession | None = None
        self._observation: DebateObservation | None = None
        self._reset_kwargs: dict[str, Any] = {}
        #: the episode's accepted actions (role, content), in order: what a re-run re-sends
        self._actions: list[tuple[Role, str]] = []
        self._turns: list[TurnLog] = []
        self._record: EpisodeRewards | None = None
        self._trace = EpisodeTrace(TraceHandles(
            turns=lambda: self._turns, observation=lambda: self._observation, done=lambda: self._done,
            record=lambda: self._record, finish=self._finish, wait_record=self._wait_record, state_at=self._state_at,
            close=self._close_session, grade_branches=self._grade_branches))

    @property
    def trace(self) -> EpisodeTrace:
        """The trainer's handle on the current episode (not a tool: TRL only exposes functions)."""
        return self._trace

    # ------------------------------------------------------------------ TRL contract

    def reset(self, **row: Any) -> str:
        """Start a new debate; returns the solver's instructions (appended to the prompt).

        The row may carry ``problem_id`` (replay that problem) or ``seed``; rows of the same
        prompt carry the same value, so a GRPO group debates one problem.
        """
        kwargs = {k: row[k] for k in ("seed", "problem_id") if row.get(k) is not None}
        if self._max_rounds is not None:
            kwargs["max_rounds"] = self._max_rounds
        if self._mode is not None:
            kwargs["mode"] = self._mode
        result = self._with_session(lambda session: session.reset(**kwargs), may_reopen=True)
        self._reset_kwargs = {**kwargs, "problem_id": result.observation.problem_id}
        self._actions = []
        self._observation = result.observation
        self._turns = []
        self._record = None
        return render_instructions(result.observation)

    def submit_solution(self, solution: str) -> str:
        """Submit your solution as the solver.

        Args:
            solution: Your complete solution, ending with the final answer in \\boxed{...}.

        Returns:
            The next role's instructions.
        """
        return self._act(Role.SOLVER, action_content("submit_solution", {"solution": solution}), "tool")

    def submit_verdict(self, verdict: str, critique: str) -> str:
        """Submit your review of the solution as the verifier.

        Args:
            verdict: CORRECT if the solution's final answer is right, otherwise INCORRECT.
            critique: Your step-by-step check of the solution.

        Returns:
            The next role's instructions.
        """
        return self._act(Role.VERIFIER, action_content("submit_verdict", {"verdict": verdict, "critique": critique}),
                         "tool")

    def submit_final_answer(self, answer: str) -> str:
        """Close the debate as the judge by giving the final answer.

        Args:
            answer: The final answer in LaTeX, for example \\frac{1}{2}.

        Returns:
            A message that the debate is over.
        """
        return self._act(Role.JUDGE, action_content("submit_final_answer", {"answer": answer}), "tool")

    def get_reward(self) -> float:
        """The episode reward: finishes the debate if the rollout left it open, then waits up
        to ``_rewards_timeout_s`` for the server's delayed rewards record.

        Raises:
            TimeoutError: no record in time (the server may be overloaded or down).
        """
        return self._wait_record().episode_reward

    # ------------------------------------------------------------------ for trainers

    def _wait_record(self) -> EpisodeRewards:
        if self._record is None:
            self._finish(None)
            assert self._session is not None
            record = self._with_session(lambda session: session.rewards(wait=True, timeout_s=self._rewards_timeout_s))
            if record is None:
                raise TimeoutError(
                    f"no rewards for episode {self._session.episode_id} after {self._rewards_timeout_s:.0f}s: "
                    f"is the env server at {self._base_url} grading?"
                )
            self._record = record
        return self._record

    def _finish(self, last_message: str | None) -> None:
        """Complete an unfinished debate: ``last_message`` (a rollout's final assistant text
        without a tool call) becomes the current role's action; remaining turns are forfeited."""
        if self._observation is None:
            raise RuntimeError("reset() was never called")
        if last_message is not None and last_message.strip() and self._observation.role is not None:
            self._send(self._observation.role, last_message, "fallback")
        while self._observation.role is not None:
            self._send(self._observation.role, _FORFEIT, "forfeit")

    def _grade_branches(self, actions: Sequence[str]) -> list[TurnReward | None]:
        """Each action played as the current turn on its own fork of the session, at once: the
        fork steps with the action (a text the server rejects is the forfeit placeholder, as
        :meth:`_send`), forfeits the turns after it, is graded, and is closed; the server's grade
        of that turn is returned, ``None`` when the branch failed (a refused fork, a lost
        server: logged). The episode is not touched."""
        observation = self._observation
        if observation is None or observation.role is None:
            raise RuntimeError("no turn is due: reset() was never called or the debate is over")
        t, role = observation.t, observation.role
        session = self._with_session(lambda session: session)

        def grade(action: str) -> TurnReward | None:
            fork = None
            try:
                fork, result = session.fork(t)
                try:
                    result = fork.step(role, action)
                except MuxError as exc:
                    if exc.code != "INVALID_ACTION":
                        raise
                    result = fork.step(role, _FORFEIT)
                while result.observation.role is not None:
                    result = fork.step(result.observation.role, _FORFEIT)
                record = fork.rewards(wait=True, timeout_s=self._rewards_timeout_s)
                return next((turn for turn in record.turns if turn.t == t), None) if record is not None else None
            except (MuxError, ConnectionError, SessionLostError, TimeoutError) as exc:
                log.warning("branch of episode %s at t=%d not graded: %s", observation.episode_id, t, exc)
                return None
            finally:
                if fork is not None:
                    try:
                        fork.close()
                    except (MuxError, ConnectionError, SessionLostError) as exc:
                        log.info("fork %s: %s while closing it", fork.session_id, exc)

        with ThreadPoolExecutor(max_workers=max(1, len(actions)), thread_name_prefix="branch") as pool:
            return list(pool.map(grade, actions))

    def _close_session(self) -> None:
        """Close this environment's session (written closed in the ledger, when there is one)."""
        session, self._session = self._session, None
        if session is None:
            return
        try:
            session.close()
        except (ConnectionError, SessionLostError, MuxError) as exc:  # gone already: nothing left to close
            log.info("env session %s: %s while closing it", session.session_id, exc)
        if self._ledger is not None:
            self._ledger.closed(session.session_id)

    def _state_at(self, t: int) -> DebateObservation:
        if self._session is None or self._observation is None:
            raise RuntimeError("reset() was never called")
        episode_id = self._observation.episode_id
        state = self._with_session(lambda session: session.state(t=t, episode_id=episode_id))
        return DebateObservation.model_validate(state["observation"]["observation"])

    @property
    def _done(self) -> bool:
        return self._observation is not None and self._observation.role is None

    def _act(self, role: Role, content: str, source: str) -> str:
        """A tool call: submit, log the turn with the text returned to the model."""
        if self._observation is None:
            raise RuntimeError("reset() was never called")
        if self._observation.role is None:
            raise ValueError(DEBATE_OVER)
        if role is not self._observation.role:
            raise ValueError(f"It is the {self._observation.role.value}'s turn: call {TOOL_FOR_ROLE[self._observation.role]}.")
        try:
            result = self._with_session(lambda session: session.step(role, content))
        except MuxError as exc:  # rejected (empty, too long): the turn is not consumed
            raise ValueError(str(exc.data.get("message", exc))) from None
        returned = render_instructions(result.observation)
        self._log(result, role, content, source, returned)
        return returned

    def _send(self, role: Role, content: str, source: str) -> None:
        """A fallback or forfeit action; a rejected text is replaced by the placeholder."""
        try:
            result = self._with_session(lambda session: session.step(role, content))
        except MuxError as exc:
            if exc.code != "INVALID_ACTION":
                raise
            content = _FORFEIT
            result = self._with_session(lambda session: session.step(role, content))
            source = "forfeit"
        self._log(result, role, content, source, None)

    def _log(self, result: StepResult, role: Role, content: str, source: str, returned: str | None) -> None:
        seen = render_instructions(self._observation) if self._observation is not None else None
        self._actions.append((role, content))
        self._observation = result.observation
        self._turns.append(TurnLog(result.observation.t - 1, role, source, returned, seen))

    def _with_session(self, call, may_reopen: bool = False):
        """Run ``call(session)``. The connection re-attaches on its own after a drop; when the
        session is gone (server restarted without state, reaped) or its replica stayed down
        past the reconnect budget, a new session is placed on a healthy replica, the episode
        is re-run there (``reset``: just reopened) and ``call`` runs once more."""
        if self._session is None:
            self._session = self._open_session()
        try:
            return call(self._session)
        except (ConnectionError, SessionLostError) as exc:
            log.warning("env session %s lost (%s): continuing on a new session", self._session.session_id, exc)
            self._session = self._open_session()
            if not may_reopen and self._observation is not None:
                self._rerun_episode()
            return call(self._session)
        except MuxError as exc:
            if not (may_reopen and exc.code == "UNKNOWN_SESSION"):
                raise
            self._session = self._open_session()
            return call(self._session)

    def _open_session(self) -> SyncMuxSession:
        """A new session on the least-loaded healthy replica, written in the ledger (when the
        factory has one) before it is used."""
        session = self._client.open_session()
        if self._ledger is not None:
            self._ledger.opened(self._client.replica_of(session), session)
        return session

    def _rerun_episode(self) -> None:
        """Replay the current episode on the (new) session: same problem, same settings, the
        same accepted actions in order. The debate is deterministic given these, so every
        observation equals the original except for the episode id (checked: role, turn, round
        and transcript of the last one). Counted in the pool's ``reruns``.

        Raises:
            RuntimeError: the re-run debate diverged (the server changed its rules).
        """
        assert self._session is not None and self._observation is not None
        before = self._observation
        result = self._session.reset(**self._reset_kwargs)
        for role, content in self._actions:
            result = self._session.step(role, content)
        after = result.observation
        if (after.role, after.t, after.round, after.transcript) != (before.role, before.t, before.round,
                                                                     before.transcript):
            raise RuntimeError(f"episode {before.episode_id} re-run on problem {before.problem_id} diverged at "
                               f"t={after.t}")
        self._observation = after
        self._client.count_rerun()
        log.warning("episode %s re-run as %s on %s (re-runs so far: %d)", before.episode_id, after.episode_id,
                    self._client.replica_of(self._session), self._client.reruns)


def environment_factory(base_url: str | Sequence[str], token: str | None = None, max_rounds: int | None = None,
                        rewards_timeout_s: float = GRADED_EPISODE_WAIT_S,
                        mode: str | None = None, rerun_after_s: float = RERUN_AFTER_S,
                        ledger: SessionLedger | None = None) -> type[DebateEnvironment]:
    """The zero-argument factory to pass as ``GRPOTrainer(environment_factory=...)``.

    Args:
        base_url: the env server (``http://host:port``), or several replicas (a list or a
            comma-separated string): sessions are placed on the least-loaded healthy one.
        rerun_after_s: how long an unreachable replica's episodes wait for it before they
            are re-run on another replica (the connection's reconnect budget), seconds.
        token: bearer token, if the server requires one.
        max_rounds: per-episode override of the server's solver/verifier rounds.
        rewards_timeout_s: how long ``get_reward`` waits for the graded record.
        mode: every episode's mode (``"debate"`` or ``"single"``, RFC 0006); ``None``: the
            server's ``--mode``.
        ledger: where every session opened is written down
            (:class:`~trainer_client.rollout.sessions.SessionLedger`), so that sessions are
            closed at the end of training, or by the run that resumes a dead one.

    Returns:
        A :class:`DebateEnvironment` subclass bound to these settings (a class is a zero-arg
        factory); all its instances share one connection per process.
    """
    return type(
        "DebateEnvironment",
        (DebateEnvironment,),
        {"_base_url": tuple(parse_urls(base_url)), "_token": token, "_max_rounds": max_rounds,
         "_rewards_timeout_s": rewards_timeout_s, "_mode": mode, "_rerun_after_s": rerun_after_s,
         "_ledger": ledger},
    )
