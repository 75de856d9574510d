"""User reward functions over debate transcripts, run in a separate process.

A reward author writes a module-level function and marks it with :func:`reward_function`:

.. code-block:: python

    # my_rewards.py
    from trainer_client.credit.reward_functions import EvaluateResult, RolloutMessage, StepOutput, reward_function

    @reward_function(mode="pointwise")
    def boxed_solver_turns(messages: list[RolloutMessage], ground_truth, **kwargs) -> EvaluateResult:
        steps, turn = [], 0
        for message in messages:
            if message.role != "assistant":
                continue
            text = (message.content or "") + " ".join(str(c) for c in message.tool_calls or [])
            steps.append(StepOutput(step_index=turn, base_reward=1.0 if "boxed" in text else 0.0))
            turn += 1
        return EvaluateResult(score=sum(s.base_reward for s in steps) / max(1, len(steps)), step_outputs=steps)

and configures it (``reward_function: {path: "my_rewards:boxed_solver_turns"}``). Two modes,
chosen by configuration (the signature only suggests one, see :func:`suggest_mode`):

- ``pointwise``: ``(messages: list[RolloutMessage], ground_truth, **kwargs) -> EvaluateResult``, once per rollout;
- ``batch``: ``(rollouts_messages: list[list[RolloutMessage]], ground_truths: list, **kwargs) -> list[EvaluateResult]``,
  once per batch (one result per rollout, in order).

:class:`RewardFunctionRunner` calls the function in a worker process (pebble, as the env
server's grader) with a timeout, passing and returning JSON through the pydantic models below.
An exception, a timeout, a wrong return type or a batch result of the wrong length gives
``EvaluateResult(score=0, is_score_valid=False, reason=...)`` for the rollouts concerned, never a
crashed trainer. ``StepOutput.step_index`` counts assistant messages (after the prompt), not
debate turns; how it maps onto turns (rejected tool calls, fallbacks, forfeits):
:mod:`trainer_client.credit.step_alignment`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = [
    "EvaluateResult",
    "RewardFunctionRunner",
    "RewardFunctionSpec",
    "RolloutMessage",
    "StepData",
    "StepOutput",
    "load_reward_function",
    "reward_function",
    "suggest_mode",
]

Mode = Literal["pointwise", "batch"]


class RolloutMessage(BaseModel):
    """One chat message of a rollout (TRL's conversational format).

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        content: the text (``None`` for an assistant message that only calls tools).
        tool_calls: the assistant's tool calls, as TRL records them.
        name, tool_call_id: optional tool-message fields.
    """

    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class StepOutput(BaseModel):
    """A user reward for one step.

    Attributes:
        step_index: the 0-based index of an assistant message: its position among the messages
            with role ``"assistant"`` after the prompt (the Nth message the assistant produced),
            not the debate turn. The reward lands on the debate turn that message produced (its
            step's ``step_info["assistant_turn_index"]``). An int, or a string of digits; an
            index that names a rejected tool call, a message written after the debate ended, or
            nothing, is reported as unmatched (rules: :mod:`trainer_client.credit.step_alignment`).
        base_reward: the step's reward.
        metrics: extra named numbers, logged as they are.
        reason: a human-readable explanation.
    """

    step_index: int | str
    base_reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    reason: str | None = None


class EvaluateResult(BaseModel):
    """A user reward function's verdict on one rollout.

    Attributes:
        score: the episode-level reward.
        is_score_valid: ``False`` when the score must not be trusted (set by the runner on an
            exception or timeout).
        reason: explanation (the error, for invalid scores).
        step_outputs: per-step rewards, or ``None`` (results without step outputs stay valid).
        metrics: extra named numbers.
    """

    score: float
    is_score_valid: bool = True
    reason: str | None = None
    step_outputs: list[StepOutput] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)

    @classmethod
    def invalid(cls, reason: str) -> EvaluateResult:
        """A zero, invalid score with ``reason``."""
        return cls(score=0.0, is_score_valid=False, reason=reason)


class StepData(BaseModel):
    """One step of a rollout (one debate turn), as the trainer records it for step-level credit.

    Every field is filled by the system (:func:`trainer_client.credit.step_credit.rollout_steps`, then
    :func:`trainer_client.credit.step_credit.step_rewards`); reward functions never build one.

    Attributes:
        step_index: the debate turn ``t``.
        observation_data: what the acting role was shown (the rendered instructions; ``None`` if
            the environment's log lacks the turn).
        action: ``{"role": ...}``, the role that acted.
        is_done: whether the episode ended with this step.
        step_info: ``"role"`` (the debate role), ``"source"`` (``"tool"``, ``"fallback"`` or
            ``"forfeit"``: how the turn was submitted) and, on every turn an assistant message
            produced, ``"assistant_turn_index"``: that message's index among the rollout's
            assistant messages after the prompt, which ``StepOutput.step_index`` names (absent on
            forfeits and when the messages cannot be matched; see
            :mod:`trainer_client.credit.step_alignment`).
        base_reward: the step reward ``r_t``: set by the aligner from the user's step output
            (``None`` until then: not given), then by ``step_rewards`` on every step to the
            ``r_t`` the trainer uses (the user's, the configured default where the user gave
            none, or the server's per-turn reward when the result has no step outputs).
        return_to_go: set by ``step_rewards`` (GiGPO): the discounted return
            ``R_t = r_t + γ·R_{t+1}`` from this step (Eq. 5), the value GiGPO's step level groups.
            ``None`` before.

    The per-turn advantages are not kept here: GiGPO computes them on the gathered batch after
    the steps (:func:`trainer_client.credit.gigpo.gigpo_turn_values`), and the trainer keeps no
    per-step log-probabilities.
    """

    step_index: int
    observation_data: Any = None
    action: Any = None
    is_done: bool = False
    step_info: dict[str, Any] = Field(default_factory=dict)
    base_reward: float | None = None
    return_to_go: float | None = None


@dataclass(frozen=True)
class RewardFunctionSpec:
    """A registered reward function.

    Attributes:
        path: ``"module:qualname"``, importable in the worker process.
        mode: ``"pointwise"`` or ``"batch"``.
        timeout_s: wall-clock limit of one call, seconds (pointwise: per rollout).
        name: a display name (metrics prefix).
    """

    path: str
    mode: Mode
    timeout_s: float
    name: str


def suggest_mode(func: Callable[..., Any]) -> Mode:
    """The mode the signature suggests: ``batch`` when the first parameter is named
    ``rollouts_messages`` or annotated ``list[list[RolloutMessage]]``, else ``pointwise``."""
    params = list(inspect.signature(func).parameters.values())
    if not params:
        return "pointwise"
    first = params[0]
    annotation = str(first.annotation)
    if first.name == "rollouts_messages" or annotation.replace(" ", "").startswith("list[list["):
        return "batch"
    return "pointwise"


def _path_of(func: Callable[..., Any]) -> str:
    qualname = getattr(func, "__qualname__", "")
    module = getattr(func, "__module__", None)
    if not module or "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(f"{func!r} is not a module-level function: reward functions run in another process and "
                        "are imported there by 'module:qualname' (lambdas and closures cannot be)")
    return f"{module}:{qualname}"


def reward_function(func: Callable[..., Any] | None = None, *, mode: Mode | None = None, timeout_s: float = 10.0,
                    name: str | None = None):
    """Mark a module-level function as a reward function (``@reward_function`` or
    ``@reward_function(mode="batch", timeout_s=30)``).

    The function is returned unchanged, with its :class:`RewardFunctionSpec` in
    ``__reward_function__``. ``mode`` given here (or later in the trainer config) decides;
    without it the signature's suggestion (:func:`suggest_mode`) is used.

    Raises:
        TypeError: a lambda, a closure, or a non-callable.
        ValueError: a non-positive timeout or an unknown mode.
    """
    if mode not in (None, "pointwise", "batch"):
        raise ValueError(f"mode must be 'pointwise' or 'batch', got {mode!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError(f"{f!r} is not callable")
        f.__reward_function__ = RewardFunctionSpec(  # type: ignore[attr-defined]  # the spec rides on the function object
            _path_of(f), mode or suggest_mode(f), timeout_s, name or f.__name__)
        return f

    return mark(func) if func is not None else mark


def _import(path: str) -> Callable[..., Any]:
    module_name, _, qualname = path.partition(":")
    if not module_name or not qualname:
        raise ValueError(f"reward function path must look like 'package.module:function', got {path!r}")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def load_reward_function(path: str, mode: Mode | None = None, timeout_s: float | None = None) -> RewardFunctionSpec:
    """The spec of the function at ``"module:qualname"``; ``mode`` and ``timeout_s`` (from
    the config) override the decorator's.

    Raises:
        ValueError: a malformed path. ImportError / AttributeError: no such function.
        TypeError: not callable.
    """
    func = _import(path)
    if not callable(func):
        raise TypeError(f"{path} is not callable")
    spec: RewardFunctionSpec | None = getattr(func, "__reward_function__", None)
    chosen_mode = mode or (spec.mode if spec else suggest_mode(func))
    if chosen_mode not in ("pointwise", "batch"):
        raise ValueError(f"mode must be 'pointwise' or 'batch', got {chosen_mode!r}")
    return RewardFunctionSpec(path, chosen_mode, timeout_s or (spec.timeout_s if spec else 10.0),
                              spec.name if spec else path.rsplit(":", 1)[-1])


# --------------------------------------------------------------------------- worker side

_RESULTS = TypeAdapter(list[EvaluateResult])


def _init_worker(paths: list[str]) -> None:
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)


def _call_in_worker(path: str, mode: Mode, payload: str) -> str:
    """Runs in the worker: JSON in, JSON out. Raises on a bad return value (the parent turns
    any exception into invalid results)."""
    func = _import(path)
    data = json.loads(payload)
    kwargs = data.get("kwargs") or {}
    if mode == "pointwise":
        messages = [RolloutMessage.model_validate(m) for m in data["messages"]]
        result = func(messages, data["ground_truth"], **kwargs)
        if isinstance(result, dict):
            result = EvaluateResult.model_validate(result)
        if not isinstance(result, EvaluateResult):
            raise TypeError(f"a pointwise reward function must return an EvaluateResult, got {type(result).__name__}")
        return result.model_dump_json()
    rollouts = [[RolloutMessage.model_validate(m) for m in messages] for messages in data["rollouts_messages"]]
    results = func(rollouts, data["ground_truths"], **kwargs)
    if not isinstance(results, list):
        raise TypeError(f"a batch reward function must return a list of EvaluateResult, got {type(results).__name__}")
    results = [EvaluateResult.model_validate(r) if isinstance(r, dict) else r for r in results]
    if not all(isinstance(r, EvaluateResult) for r in results):
        raise TypeError("a batch reward function must return a list of EvaluateResult")
    if len(results) != len(rollouts):
        raise ValueError(f"a batch reward function returned {len(results)} results for {len(rollouts)} rollouts")
    return _RESULTS.dump_json(results).decode()


# --------------------------------------------------------------------------- parent side


class RewardFunctionRunner:
    """Calls a reward function in a worker process with a timeout.

    Args:
        spec: the function (a :class:`RewardFunctionSpec`, or a decorated function).
        workers: worker processes (pointwise calls run in parallel across them).

    The worker imports the function by path with the parent's ``sys.path``. pebble kills a
    worker past the timeout and starts a new one, so later calls still work. Use as a context
    manager or call :meth:`close`.

    Raises:
        TypeError: ``spec`` is neither a spec nor a decorated function.
    """

    def __init__(self, spec: RewardFunctionSpec | Callable[..., Any], workers: int = 1) -> None:
        resolved: RewardFunctionSpec | None = (
            spec if isinstance(spec, RewardFunctionSpec) else getattr(spec, "__reward_function__", None))
        if resolved is None:
            raise TypeError("pass a RewardFunctionSpec or a function decorated with @reward_function")
        from pebble import ProcessPool

        self.spec = resolved
        # forkserver: the trainer process holds threads (torch, the env client); forking it is unsafe
        self._pool = ProcessPool(max_workers=workers, initializer=_init_worker, initargs=(list(sys.path),),
                                 context=multiprocessing.get_context("forkserver"))

    def evaluate(self, rollouts_messages: Sequence[Sequence[RolloutMessage | dict[str, Any]]], ground_truths: Sequence[Any],
                 **kwargs: Any) -> list[EvaluateResult]:
        """One :class:`EvaluateResult` per rollout, in order (invalid ones on any failure).

        Args:
            rollouts_messages: per rollout, its messages.
            ground_truths: per rollout, the reference (JSON-serialisable).
            **kwargs: JSON-serialisable extras passed to the function.

        Raises:
            ValueError: the two sequences differ in length.
        """
        if len(rollouts_messages) != len(ground_truths):
            raise ValueError(f"{len(rollouts_messages)} rollouts for {len(ground_truths)} ground truths")
        rollouts = [[RolloutMessage.model_validate(m).model_dump(mode="json") if isinstance(m, dict)
                     else m.model_dump(mode="json") for m in messages] for messages in rollouts_messages]
        if self.spec.mode == "pointwise":
            futures = [self._schedule({"messages": messages, "ground_truth": truth, "kwargs": kwargs})
                       for messages, truth in zip(rollouts, ground_truths, strict=True)]
            return [self._result(future, single=True)[0] for future in futures]
        future = self._schedule({"rollouts_messages": rollouts, "ground_truths": list(ground_truths), "kwargs": kwargs})
        return self._result(future, single=False, count=len(rollouts))

    def _schedule(self, payload: dict[str, Any]):
        try:
            text = json.dumps(payload)
        except (TypeError, ValueError) as exc:
            return exc
        return self._pool.schedule(_call_in_worker, args=(self.spec.path, self.spec.mode, text),
                                   timeout=self.spec.timeout_s)

    def _result(self, future, single: bool, count: int = 1) -> list[EvaluateResult]:
        if isinstance(future, Exception):
            return [EvaluateResult.invalid(f"arguments are not JSON-serialisable: {future}")] * count
        try:
            text = future.result()
            if single:
                return [EvaluateResult.model_validate_json(text)]
            return _RESULTS.validate_json(text)
        except FutureTimeoutError:
            reason = f"timeout: {self.spec.name} ran past {self.spec.timeout_s:g}s and was killed"
        except ValidationError as exc:
            reason = f"invalid result from {self.spec.name}: {exc.error_count()} validation errors"
        except Exception as exc:  # the user's exception, re-raised by pebble, or a dead worker
            reason = f"{self.spec.name} raised {type(exc).__name__}: {exc}"
        return [EvaluateResult.invalid(reason) for _ in range(count)]

    def close(self) -> None:
        """Stop the worker processes."""
        self._pool.stop()
        self._pool.join(timeout=5)

    def __enter__(self) -> RewardFunctionRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
