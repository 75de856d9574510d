"""The debate for OpenEnv's harness runtime (RFC 005, ``openenv.core.harness``): a
``ResourceSessionFactory`` whose sessions are debates on the env server, so that OpenEnv's own
``CollectRunner`` (SFT datasets from any model step) and the runtimes built on it play debates.

As OpenEnv's own environments keep it (``envs/<env>/harness.py``), it is a thin wrapper over the
environment's client: each :class:`DebateResourceSession` is one
:class:`~trainer_client.rollout.environment.DebateEnvironment` (the adapter TRL trains through),
so a harness rollout gets what a training rollout gets: sessions multiplexed over one WebSocket
per process and server, replicas (the least-loaded healthy one), re-attach after a dropped
connection (a server with ``--state-dir`` resumes the session) and, when a session is gone, the
episode re-run on a new one with the same actions. The transcript is the training layout: the
system message :data:`~trainer_client.rollout.tools.DEBATE_SYSTEM_PROMPT`, the solver's
instructions, and each tool's result the next role's instructions.

- Tools (MCP ``Tool``: name, description, input schema), the schemas TRL renders for training:
  ``submit_solution(solution)``, ``submit_verdict(verdict, critique)``,
  ``submit_final_answer(answer)``; one model plays every role, calling the tool of the role
  whose turn it is.
- The reward is the server's: the tool call that ends the debate waits for the server's graded
  record and returns its episode reward in the result's ``metadata["reward"]`` (no other tool
  result carries a reward), and :meth:`DebateResourceSession.verify` forwards the same record
  (``env_reward``, per-role rewards in ``metrics``, the record in ``artifacts``). Nothing is
  graded here.
- A model's mistake is the harness's error form and the episode goes on: an unknown tool, the
  wrong role's tool, missing or extra arguments, an action the server rejects: a ``ToolResult``
  with ``error`` set (and the message as ``data``), nothing sent or consumed.
- A rollout that stops before the debate ends (no tool call, the harness's turn limit) is
  finished in :meth:`~DebateResourceSession.verify` as a training rollout is (its last assistant
  text becomes the current role's action, the remaining turns are forfeited) and graded.
- A debate that fails (its server down past the reconnect budget and no replica to re-run it on,
  no graded record in time) raises to the runner, which counts it as failed (``CollectRunner``:
  ``num_failed``), and is written to the factory's ``failures_path`` (JSON lines: the runner's
  episode id, the task, the server episode, the error): never dropped silently.

Works with ``openenv-core`` 0.3.0 and OpenEnv 0.10 (``openenv``), which install the same
``openenv.core.harness`` interface.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import ResourceSession, ResourceSessionFactory, ToolResult, VerifyResult
from openenv.core.llm_client import OpenAIClient

from env_server.client import GRADED_EPISODE_WAIT_S, MuxError
from env_server.protocol.markers import Role
from trainer_client.rollout.environment import RERUN_AFTER_S, DebateEnvironment, environment_factory
from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT, TOOL_ARGUMENTS, TOOL_FOR_ROLE, TOOL_PARAMETERS

__all__ = ["DebateResourceSession", "DebateSessionFactory", "PerCallOpenAIClient", "debate_tools",
           "scripted_model_step"]

log = logging.getLogger(__name__)


def debate_tools() -> list[Tool]:
    """The role tools as MCP tools, with the JSON schemas TRL renders into the training prompt
    (:data:`~trainer_client.rollout.tools.TOOL_PARAMETERS`, in TRL's order; no transformers needed)."""
    return [Tool(name=name, description=description, input_schema=parameters)
            for name, (description, parameters) in TOOL_PARAMETERS.items()]


def _task_reset(task: Any, seed: int | None) -> dict[str, Any]:
    """``reset`` keywords of a harness task: an ``int`` (a problem seed), a mapping with
    ``seed`` and/or ``problem_id``, or anything else with a ``seed`` (a runtime's own row: TRL's
    async GRPO calls ``create(prompt, seed=group_id, episode_id=...)``, so every rollout of a
    group debates one problem), or ``None`` (``seed``, else the server's next problem).

    Raises:
        TypeError: a task of another kind and no ``seed``.
    """
    if task is None or (seed is not None and not isinstance(task, int | dict)):
        return {} if seed is None else {"seed": seed}
    if isinstance(task, bool) or not isinstance(task, int | dict):
        raise TypeError(f"a debate task is a problem seed (int) or {{'seed': ..., 'problem_id': ...}}, got {task!r}")
    if isinstance(task, int):
        return {"seed": task}
    unknown = set(task) - {"seed", "problem_id"}
    if unknown:
        raise TypeError(f"a debate task takes 'seed' and 'problem_id', not {sorted(unknown)}")
    return {k: v for k, v in task.items() if v is not None}


class DebateResourceSession(ResourceSession):
    """One debate for one harness rollout (see the module docstring). Made by
    :meth:`DebateSessionFactory.create`.

    Raises (from the constructor):
        ConnectionError: no replica reachable.
        MuxError: the server refused the reset (an unknown ``problem_id``).
    """

    def __init__(self, environment: DebateEnvironment, factory: DebateSessionFactory, task: Any,
                 episode_id: str | None) -> None:
        self._environment, self._factory, self._task, self._episode_id = environment, factory, task, episode_id
        self._tools = {tool.name: tool for tool in factory.tools}
        self._closed = False
        try:
            self._instructions = self._guard("reset", lambda: environment.reset(**_task_reset(task, None)))
        except BaseException:  # the runner never gets this session to close: close what the reset opened
            self.close()
            raise

    @property
    def server_episode_id(self) -> str | None:
        """The server's id of this debate (its records, the viewer, the trajectory log)."""
        observation = self._environment.trace.observation
        return observation.episode_id if observation is not None else None

    def initial_messages(self) -> list[dict[str, Any]]:
        """The training prompt: the system message and the solver's instructions."""
        return [{"role": "system", "content": DEBATE_SYSTEM_PROMPT}, {"role": "user", "content": self._instructions}]

    def list_tools(self) -> list[Tool]:
        """``submit_final_answer``, ``submit_solution``, ``submit_verdict`` (:func:`debate_tools`)."""
        return list(self._tools.values())

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Play one role's turn. The result's ``data`` is the next role's instructions (or the
        debate-over message); the call that ends the debate carries the server's episode reward
        in ``metadata["reward"]`` and ``done``. A mistake (see the module docstring) is a
        ``ToolResult`` with ``error``, and the debate waits for a valid call.

        Raises:
            ConnectionError, TimeoutError: the debate failed (written to ``failures_path``).
        """
        trace = self._environment.trace
        problem = self._mistake(name, arguments)
        if problem is not None:
            return ToolResult(data=problem, error=problem, metadata={"role": self._role_name()})
        role = self._role_name()
        try:
            returned = self._guard(name, lambda: getattr(self._environment, name)(**arguments))
        except ValueError as exc:  # the server rejected the action (empty, too long): not consumed
            return ToolResult(data=str(exc), error=str(exc), metadata={"role": role})
        metadata: dict[str, Any] = {"role": role, "server_episode_id": self.server_episode_id}
        if trace.done:
            record = self._guard("rewards", trace.wait_record)
            metadata["reward"] = record.episode_reward
        return ToolResult(data=returned, done=trace.done, metadata=metadata)

    def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
        """Finish the debate if the rollout left it open (the last assistant text as the current
        role's action, the rest forfeited), wait for the server's graded record and forward it:
        ``env_reward`` its episode reward, ``metrics`` each role's local reward and the facts,
        ``artifacts`` the record and the server's episode id.

        Raises:
            ConnectionError, TimeoutError: the debate failed (written to ``failures_path``).
        """
        trace = self._environment.trace
        finished_here = not trace.done
        if finished_here:
            last = next((m.get("content") for m in reversed(transcript) if m.get("role") == "assistant"), None)
            self._guard("finish", lambda: trace.finish(last if isinstance(last, str) else None))
        record = self._guard("rewards", trace.wait_record)
        facts = record.facts
        metrics: dict[str, Any] = {f"local_reward/{Role(role).value}": value for role, value in facts.local_rewards.items()}
        metrics.update({"first_answer_correct": facts.first_answer_correct,
                        "final_answer_correct": facts.final_answer_correct, "judge_correct": facts.judge_correct,
                        "turns": len(trace.turns), "finished_by_harness": finished_here,
                        "forfeited_turns": sum(turn.source == "forfeit" for turn in trace.turns)})
        return VerifyResult(env_reward=record.episode_reward, done=True, metrics=metrics,
                            artifacts={"server_episode_id": record.episode_id, "problem_id": record.problem_id,
                                       "rewards": record.model_dump(mode="json")})

    def close(self) -> None:
        """Close the debate's session on the server (idempotent)."""
        if not self._closed:
            self._closed = True
            self._environment.trace.close()

    # ------------------------------------------------------------------ internals

    def _role_name(self) -> str | None:
        observation = self._environment.trace.observation
        return observation.role.value if observation is not None and observation.role is not None else None

    def _mistake(self, name: str, arguments: Any) -> str | None:
        """What is wrong with a tool call before anything is sent (``None``: nothing)."""
        observation = self._environment.trace.observation
        if name not in self._tools:
            return f"unknown tool {name!r}: the tools are {', '.join(self._tools)}"
        if observation is None or observation.role is None:
            return "the debate is over"
        role = observation.role
        if TOOL_ARGUMENTS[name][0] is not role:
            return f"it is the {role.value}'s turn: call {TOOL_FOR_ROLE[role]}"
        expected = set(TOOL_ARGUMENTS[name][1])
        if not isinstance(arguments, dict) or set(arguments) != expected:
            given = sorted(arguments) if isinstance(arguments, dict) else type(arguments).__name__
            return f"{name} takes the arguments {sorted(expected)}, got {given}"
        wrong = [key for key, value in arguments.items() if not isinstance(value, str)]
        if wrong:
            return f"{name}: the arguments {wrong} must be strings"
        return None

    def _guard(self, what: str, call: Any) -> Any:
        """Run ``call()``; a failure of the debate itself (not a refused action) is written to the
        factory's failures file, then raised."""
        try:
            return call()
        except ValueError:
            raise
        except (ConnectionError, TimeoutError, MuxError, RuntimeError, OSError) as exc:
            self._factory.record_failure(self._episode_id, self._task, self.server_episode_id, what, exc)
            raise


class DebateSessionFactory(ResourceSessionFactory):
    """Debates on the env server for OpenEnv's harness runtime (see the module docstring).

    Args:
        base_url: the env server, or several replicas (a list or a comma-separated string).
        token: the server's bearer token, if any.
        max_rounds: solver/verifier rounds per debate (``None``: the server's).
        mode: ``debate`` or ``single`` (``None``: the server's default, a debate).
        rewards_timeout_s: how long the last tool call and ``verify`` wait for the graded record.
        rerun_after_s: how long a replica may stay unreachable before a debate is re-run elsewhere.
        failures_path: a JSON-lines file each failed debate is appended to (``None``: logged only).

    ``create(task, seed, episode_id)`` takes a task as a problem seed (``int``), a mapping with
    ``seed`` and/or ``problem_id``, another runtime's row with a ``seed`` (TRL's async GRPO: the
    dataset prompt and the group's id), or ``None`` (then ``seed``, else the server's next
    problem); ``episode_id`` is the runner's id (kept in the failures file; the server names its own).
    """

    def __init__(self, base_url: str | Sequence[str], token: str | None = None, *, max_rounds: int | None = None,
                 mode: str | None = None, rewards_timeout_s: float = GRADED_EPISODE_WAIT_S,
                 rerun_after_s: float = RERUN_AFTER_S, failures_path: str | Path | None = None) -> None:
        self.environment_class = environment_factory(base_url, token, max_rounds, rewards_timeout_s, mode,
                                                     rerun_after_s)
        self.tools = debate_tools()
        self.failures_path = Path(failures_path) if failures_path is not None else None
        self._lock = threading.Lock()

    def create(self, task: Any = None, seed: int | None = None, episode_id: str | None = None) -> DebateResourceSession:
        """A new debate (a session on the least-loaded healthy replica, reset on the task).

        Raises:
            TypeError: a task of another kind.
            ConnectionError: no replica reachable (written to ``failures_path``).
        """
        reset_task = _task_reset(task, seed) if task is not None or seed is not None else None
        return DebateResourceSession(self.environment_class(), self, reset_task, episode_id)

    def record_failure(self, episode_id: str | None, task: Any, server_episode_id: str | None, what: str,
                       exc: BaseException) -> None:
        """Write one failed debate (a JSON line in ``failures_path``) and log it."""
        line = {"episode_id": episode_id, "task": task, "server_episode_id": server_episode_id, "during": what,
                "error": type(exc).__name__, "message": str(exc)}
        log.warning("debate %s failed during %s: %s: %s", episode_id, what, type(exc).__name__, exc)
        if self.failures_path is None:
            return
        with self._lock:
            self.failures_path.parent.mkdir(parents=True, exist_ok=True)
            with self.failures_path.open("a") as handle:
                handle.write(json.dumps(line, default=str) + "\n")


def scripted_model_step(source: Any, seeds: Sequence[int], policy: Literal["reference", "noisy"] = "noisy", p: float = 0.3,
                        seed: int = 0) -> Any:
    """A harness ``ModelStep`` that plays every role with the rule-based debaters of
    ``mathdebate play`` (:class:`env_server.client.play.ScriptedDebaters`: oracles that read the
    reference solution and err with probability ``p``), answering with the role's tool call:
    what ``CollectRunner`` needs to build a dataset, or a test, without a model.

    The problem is recognised by its text in the first user message, among
    ``source.by_seed(s)`` for ``s`` in ``seeds`` (the tasks given to the runner); the acting role by
    the ``[SOLVER]``/``[VERIFIER]``/``[JUDGE]`` tag of the last instructions. Draws are seeded by
    (``seed``, problem, turn), so a collection is reproducible.

    Raises (when called):
        LookupError: the first user message holds none of the problems.
    """
    import random

    from openenv.core.harness import ModelStepResult
    from openenv.core.llm_client import LLMResponse, ToolCall

    from env_server.client.play import ScriptedDebaters
    from env_server.debate.answers import answer_key, final_answer

    problems = [source.by_seed(s) for s in seeds]

    def model_step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> Any:
        first_user = next(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        problem = next((q for q in problems if q.problem in first_user), None)
        if problem is None:
            raise LookupError("the debate's problem is none of the scripted step's problems")
        tagged = next(str(m["content"]) for m in reversed(messages)
                      if m.get("role") in ("user", "tool") and str(m.get("content", "")).startswith("["))
        role = Role(tagged[1:tagged.index("]")].lower())
        # the solver's accepted solutions (a refused call's result is an error, not the next role's tagged instructions)
        results = {m.get("tool_call_id"): str(m.get("content", "")) for m in messages if m.get("role") == "tool"}
        calls = [json.loads(call["function"]["arguments"]) for m in messages if m.get("role") == "assistant"
                 for call in m.get("tool_calls") or []
                 if call["function"]["name"] == "submit_solution" and results.get(call.get("id"), "").startswith("[")]
        debaters = ScriptedDebaters(policy, p, source, random.Random(f"{seed}:{problem.problem_id}:{len(messages)}"))
        if role is Role.SOLVER:
            name, arguments = "submit_solution", {"solution": debaters.solver(problem)[0]}
        else:
            answer = final_answer(calls[-1]["solution"]) if calls else None
            right = answer is not None and answer_key(answer) == answer_key(problem.answer)
            if role is Role.VERIFIER:
                critique, _, verdict = debaters.verifier(right).rpartition("VERDICT:")
                name, arguments = "submit_verdict", {"verdict": verdict.strip(), "critique": critique.strip()}
            else:
                name, arguments = "submit_final_answer", {"answer": answer or "no answer"}
        call = ToolCall(id=f"call-{len(messages)}", name=name, args=arguments)
        return ModelStepResult(response=LLMResponse(content="", tool_calls=[call]))

    return model_step


class PerCallOpenAIClient(OpenAIClient):
    """OpenEnv's ``OpenAIClient`` (an OpenAI-compatible endpoint: ``vllm serve``, a hosted API)
    that ``build_model_step`` of ``openenv-core`` 0.3.0 can call more than once.

    Why ours: openenv-core 0.3.0's ``build_model_step`` runs each call in a new event loop
    (``openenv.core.utils.run_async_safely``, i.e. ``asyncio.run``), while ``OpenAIClient`` keeps
    one ``AsyncOpenAI`` whose connection pool is bound to the loop of its first request: the
    second call fails with ``RuntimeError: Event loop is closed``. OpenEnv 0.10's
    ``build_model_step`` keeps one loop for every call. This client makes its ``AsyncOpenAI``
    inside each call (openenv-core 0.3.0: the private ``_client`` that ``complete_with_tools``
    uses), so it works with both. Arguments as ``OpenAIClient``'s.
    """

    async def complete_with_tools(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                                  **kwargs: Any) -> Any:
        from openai import AsyncOpenAI

        shared: Any = getattr(self, "_client")  # noqa: B009  (openenv-core declares no type for it)
        async with AsyncOpenAI(base_url=shared.base_url, api_key=shared.api_key) as client:
            self._client = client
            try:
                return await super().complete_with_tools(messages, tools, **kwargs)
            finally:
                self._client = shared
