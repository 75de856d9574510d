"""The teacher pool of trace-replay DPO (channel 3): who answers replayed steps, and when a
disagreement becomes a preference pair.

For a replayed step ``t`` every teacher answers the exact ``state(t)`` chat the student saw.
If at least two teachers agree on an answer X (equivalence decided by the env's grader) and
the student's answer Y differs, the step yields a DPO pair (chosen: a teacher response giving
X; rejected: the student's response). If all teachers disagree, or the agreeing teachers agree
with the student, nothing is emitted.

Teacher calls run in background threads, after the rollouts, with per-call timeouts and
retries, a per-step call budget and call/token/cost counters; ``collect()`` hands finished
pairs to the trainer without blocking. A call that fails for good (an HTTP error, a timeout, a
dropped connection, a malformed reply: :class:`TeacherCallError`, typed with the server's own
message) is not an answer: the replay it belonged to gives no pair (its vote was not taken
among all the teachers), and it is counted (``teachers/failed_replays``, the pool's
``failures`` tally; ``docs/failures.md``). A teacher that answers without a usable answer
abstains, which is its own doing. Every (request, teacher) call is its own task on the
pool's executor (``max_workers`` threads), so a request's teachers answer in parallel; the call
that finishes last scores the request. No task waits on another, so no thread of the pool
ever blocks waiting for a free one.

A pair carries the student's token context and its own tokens from the request
(:class:`ReplayRequest` ``context_ids``/``rejected_ids``, cut from the rollout by the trainer);
the trainer adds the chosen side's token ids (:mod:`trainer_client.losses.replay_pairs`). Pairs whose
agreeing majority includes an oracle teacher (reference solutions) are labelled
``gold_supervised``.

This module is longer than 500 lines: the teacher kinds (OpenAI-compatible in two layouts, local
HF, oracle), the request type, the scoring and the pool are one unit that the trainer uses
together, and splitting them would only scatter the one ``TeacherConfig`` they all read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_server.client.failures import FailureTally, RequestFailure, first_lines
from env_server.client.sync import LoopThread
from env_server.debate.answers import final_answer, normalize_answer, parse_verdict
from env_server.debate.problems import ProblemSource, UnknownProblemError
from env_server.protocol.markers import Role
from trainer_client.losses.pair_store import DpoPair
from trainer_client.rollout.tool_calls import END_OF_TURN

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "AnswerEquivalence",
    "HFTeacher",
    "OpenAITeacher",
    "OracleTeacher",
    "ReplayRequest",
    "Teacher",
    "TeacherCallError",
    "TeacherConfig",
    "TeacherConnectionError",
    "TeacherPool",
    "TeacherReply",
    "TeacherTimeoutError",
    "extract_answer",
    "score_disagreement",
]

log = logging.getLogger(__name__)


class TeacherCallError(RuntimeError):
    """A teacher call that failed for good (after its retries).

    Attributes:
        failure: why, typed (``http_<status>``, ``timeout``, ``connection``,
            ``malformed_reply``), with the first lines of the server's own message.
    """

    def __init__(self, teacher: str, failure: RequestFailure) -> None:
        detail = (f"HTTP {failure.status}: {failure.message}" if failure.status is not None
                  else failure.describe())
        super().__init__(f"teacher {teacher!r}: {detail}")
        self.failure = failure


class TeacherTimeoutError(TeacherCallError, TimeoutError):
    """A teacher call with no reply within its timeout, every try."""


class TeacherConnectionError(TeacherCallError, ConnectionError):
    """A teacher call whose connection failed (refused, dropped mid-reply), every try."""


def call_failure(exc: BaseException) -> RequestFailure:
    """The typed failure of a teacher call's exception (:attr:`TeacherCallError.failure`, else
    ``timeout`` for a ``TimeoutError`` and ``teacher_error`` for anything else, e.g. a local
    model that raised)."""
    if isinstance(exc, TeacherCallError):
        return exc.failure
    kind = "timeout" if isinstance(exc, TimeoutError) else "teacher_error"
    return RequestFailure(kind, first_lines(f"{type(exc).__name__}: {exc}"))



class TeacherConfig(BaseModel):
    """One teacher (validated when the trainer config loads).

    Attributes:
        name: a label (used in pairs and counters).
        kind: ``"openai"`` (any OpenAI-compatible chat-completions endpoint: vLLM's server,
            hosted APIs), ``"hf"`` (a local Hugging Face model) or ``"oracle"`` (answers with
            the reference solution; for tests and demos).
        layout: openai and hf: how the step is asked. ``"chat"`` (default): the server's role chat as
            plain messages, the reply's text is the answer (a general chat model). ``"tools"``:
            the layout a model trained by ``mathdebate train`` answers in (a ``vllm serve`` of
            such a checkpoint, served as for ``mathdebate eval --policy openai-tools:``: hermes
            tool-call parser, the chat template of
            ``evaluation.openai_tools.training_chat_template_file``): the debate system prompt
            and the role's instructions (:func:`~trainer_client.rollout.tool_calls.turn_messages`),
            the tools through the tools API (their full schemas also in ``chat_template_kwargs``,
            a vLLM extension); the answer is the action of the reply's call of the role's tool
            (``submit_solution``/``submit_verdict``/``submit_final_answer``,
            :func:`~trainer_client.rollout.tool_calls.role_tool_action`). A reply without a
            valid call of the role's tool abstains (no answer). An ``hf`` teacher in this layout
            renders the same chat with the tools through its tokenizer's training chat template
            (TRL's, as in training) and reads the call from its own generated text: a
            checkpoint of ``mathdebate train`` (or an offline tiny model) asked locally.
        base_url: openai: the API base, e.g. ``http://teacher:8001/v1``.
        model: openai: the served model name; hf: a model id or path.
        api_key_env: openai: name of the environment variable holding the API key (the key
            itself never goes in a config file).
        temperature, max_tokens: sampling settings.
        timeout_s: per call, seconds.
        max_retries: retries on timeouts, 429 and 5xx (exponential backoff).
        cost_per_1k_tokens: for the cost counter, in USD per 1,000 tokens (prompt + completion).
        device: hf: ``"cpu"``, ``"cuda"``...
    """

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    kind: Literal["openai", "hf", "oracle"]
    layout: Literal["chat", "tools"] = "chat"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    temperature: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=1024, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    cost_per_1k_tokens: float = Field(default=0.0, ge=0)
    device: str = "cpu"

    @model_validator(mode="after")
    def _check(self) -> TeacherConfig:
        if self.kind == "openai" and not (self.base_url and self.model):
            raise ValueError(f"teacher {self.name!r}: kind 'openai' needs base_url and model")
        if self.layout == "tools" and self.kind not in ("openai", "hf"):
            raise ValueError(f"teacher {self.name!r}: layout 'tools' is for kinds 'openai' and 'hf'")
        if self.kind == "hf" and not self.model:
            raise ValueError(f"teacher {self.name!r}: kind 'hf' needs model (an id or a path)")
        return self


@dataclass(frozen=True)
class TeacherReply:
    """A teacher's answer and its token usage.

    Attributes:
        text: the response as the role's action text (what the pair's chosen side is built from).
        prompt_tokens, completion_tokens: usage.
        generated: tool layout: the reply as the model generated it (its text and
            ``<tool_call>{json}</tool_call>``); ``None`` elsewhere.
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generated: str | None = None


class Teacher(ABC):
    """Answers a chat. Implementations must be safe to call from several threads."""

    def __init__(self, config: TeacherConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @abstractmethod
    def respond(self, messages: list[dict[str, str]], problem_id: str) -> TeacherReply:
        """Answer ``messages`` (the replayed ``state(t)`` chat). ``problem_id`` is only for
        the oracle.

        Raises:
            TimeoutError, ConnectionError, RuntimeError: the call failed after its retries.
        """

    def answer(self, request: ReplayRequest) -> TeacherReply:
        """Answer a replayed step: :meth:`respond` to its chat unless the teacher asks in
        another layout (the pool calls this)."""
        return self.respond(request.messages, request.problem_id)


class OpenAITeacher(Teacher):
    """Any OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint, asked in the
    config's ``layout`` (see :class:`TeacherConfig`)."""

    def __init__(self, config: TeacherConfig) -> None:
        super().__init__(config)
        import httpx

        assert config.base_url is not None, "TeacherConfig requires base_url for kind 'openai'"
        headers = {}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise RuntimeError(f"teacher {config.name!r}: environment variable {config.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=config.base_url.rstrip("/"), headers=headers, timeout=config.timeout_s)
        self._tools: list[dict[str, Any]] | None = None
        if config.layout == "tools":
            from trainer_client.rollout.tool_calls import tool_schemas

            self._tools = tool_schemas()

    def respond(self, messages: list[dict[str, str]], problem_id: str) -> TeacherReply:
        data = self._post({"model": self.config.model, "messages": messages, "temperature": self.config.temperature,
                           "max_tokens": self.config.max_tokens})
        return TeacherReply(data["choices"][0]["message"].get("content") or "", *_usage(data))

    def answer(self, request: ReplayRequest) -> TeacherReply:
        if self._tools is None:
            return super().answer(request)
        from trainer_client.rollout.tool_calls import generated_text, reply_tool_call, role_tool_action

        data = self._post(self.tool_request(request))
        text, name, arguments = reply_tool_call(data["choices"][0]["message"])
        generated = generated_text(text, name, arguments)
        action = role_tool_action(generated, request.role) if name is not None else None
        return TeacherReply(action or "", *_usage(data), generated=generated)

    def tool_request(self, request: ReplayRequest) -> dict[str, Any]:
        """The chat-completions body of a tool-layout call for ``request`` (see
        :class:`TeacherConfig` ``layout``)."""
        from trainer_client.rollout.tool_calls import TOOLS_KWARG, turn_messages

        assert self._tools is not None, "layout 'tools' only"
        return {"model": self.config.model, "messages": turn_messages(request.role, request.messages),
                "temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
                "tools": self._tools, "tool_choice": "auto", "chat_template_kwargs": {TOOLS_KWARG: self._tools}}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /chat/completions`` with retries (tenacity: timeouts, transport errors, 429 and
        5xx; exponential backoff from 0.5 s); the decoded 200 response, checked to hold a choice
        with a message.

        Raises:
            TeacherTimeoutError, TeacherConnectionError, TeacherCallError: the call failed for
                good (another 4xx at once: it does not get better by retrying), typed with the
                server's message.
        """
        import httpx
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

        from trainer_client.request_failures import server_message

        retried = f" (after {self.config.max_retries} retries)" if self.config.max_retries else ""

        def attempt() -> dict[str, Any]:
            try:
                response = self._http.post("/chat/completions", json=body)
            except httpx.TimeoutException as exc:
                raise TeacherTimeoutError(self.name, RequestFailure(
                    "timeout", f"no reply within {self.config.timeout_s:g} s{retried}")) from exc
            except httpx.TransportError as exc:
                raise TeacherConnectionError(self.name, RequestFailure(
                    "connection", first_lines(f"{type(exc).__name__}: {exc}") + retried)) from None
            if response.status_code == 200:
                return self._checked(response)
            try:
                message = server_message(response.json())
            except ValueError:
                message = response.text
            status = response.status_code
            again = status == 429 or status >= 500
            raise TeacherCallError(self.name, RequestFailure(
                f"http_{status}", (first_lines(message) or response.reason_phrase) + (retried if again else ""), status))

        def retryable(error: BaseException) -> bool:  # timeouts, transport errors, 429 and 5xx; never another 4xx
            failure = getattr(error, "failure", None)
            return isinstance(error, (TeacherTimeoutError, TeacherConnectionError)) or (
                isinstance(error, TeacherCallError) and failure is not None and failure.status is not None
                and (failure.status == 429 or failure.status >= 500))

        retrying = Retrying(stop=stop_after_attempt(self.config.max_retries + 1), retry=retry_if_exception(retryable),
                            wait=wait_exponential(multiplier=0.5, exp_base=2), reraise=True)
        return retrying(attempt)

    def _checked(self, response: Any) -> dict[str, Any]:
        """A 200 response's JSON, checked to be a chat completion with a message.

        Raises:
            TeacherCallError: ``malformed_reply``.
        """
        try:
            data = response.json()
        except ValueError:
            data = None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)
                and isinstance(choices[0].get("message"), dict)):
            raise TeacherCallError(self.name, RequestFailure(
                "malformed_reply", first_lines(f"the 200 reply is not a chat completion: {response.text}", 1, 200)))
        return data


def _usage(data: dict[str, Any]) -> tuple[int, int]:
    usage = data.get("usage") or {}
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


class HFTeacher(Teacher):
    """A local Hugging Face causal LM (loaded by :meth:`load`, or on first use)."""

    def __init__(self, config: TeacherConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        # Any: transformers 5's own annotations reject generate() on the models it loads (its self-type protocol)
        self._model: Any = None
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def load(self) -> None:
        """Load the model and tokenizer now, in the calling thread (otherwise on first use).

        :meth:`TeacherPool.from_configs` calls it from the thread that builds the pool, so no
        teacher thread runs ``from_pretrained``: transformers 5.x's ``from_pretrained`` patches
        process-wide state for its duration (``PreTrainedModel.tie_weights`` and torch's init
        functions, ``transformers.initialization``), so a load in a teacher thread beside one
        in the training thread can leave the other model's tied weights untied (seen: an
        ablation run whose policy loaded while a teacher loaded got ``lm_head`` on the meta
        device)."""
        with self._lock:
            self._load()

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self._model is None:
            assert self.config.model is not None, "TeacherConfig requires model for kind 'hf'"
            self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
            model = AutoModelForCausalLM.from_pretrained(self.config.model)
            # .train(False): inference mode, the same call torch's eval mode makes
            self._model = model.to(self.config.device).train(False)  # type: ignore[arg-type]  # mypy sees PreTrainedModel.to (functools.wraps) as unbound

    def _generate(self, messages: list[dict[str, str]], skip_special_tokens: bool,
                  **template_kwargs: Any) -> TeacherReply:
        import torch
        from transformers import BatchEncoding

        with self._lock:  # one generation at a time on one model
            self._load()
            assert self._tokenizer is not None, "loaded together with the model"
            encoded = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                          return_dict=True, **template_kwargs)
            assert isinstance(encoded, BatchEncoding), "return_dict=True gives a BatchEncoding"
            prompt = encoded.to(self.config.device)
            with torch.no_grad():
                out = self._model.generate(**prompt, max_new_tokens=self.config.max_tokens,
                                           do_sample=self.config.temperature > 0,
                                           temperature=self.config.temperature or None,
                                           pad_token_id=self._tokenizer.pad_token_id)
            new = out[0, prompt["input_ids"].shape[1]:]
            text = self._tokenizer.decode(new, skip_special_tokens=skip_special_tokens)
            assert isinstance(text, str), "one sequence decodes to one string"
            return TeacherReply(text, prompt["input_ids"].shape[1], len(new))

    def respond(self, messages: list[dict[str, str]], problem_id: str) -> TeacherReply:
        return self._generate(messages, skip_special_tokens=True)

    def answer(self, request: ReplayRequest) -> TeacherReply:
        if self.config.layout != "tools":
            return super().answer(request)
        from trainer_client.rollout.tool_calls import role_tool_action, tool_callables, turn_messages

        with self._lock:
            self._load()
        from trl.chat_template_utils import get_training_chat_template  # trl 1.16: the template GRPO renders with

        template = get_training_chat_template(self._tokenizer)
        reply = self._generate(turn_messages(request.role, request.messages), skip_special_tokens=False,
                               tools=tool_callables(), chat_template=template)
        generated = reply.text.split(END_OF_TURN)[0]
        action = role_tool_action(generated, request.role)
        return TeacherReply(action or "", reply.prompt_tokens, reply.completion_tokens, generated=generated)


class OracleTeacher(Teacher):
    """Answers every step with the problem's reference solution (tests and demos). Its answer
    is the reference answer on solver and judge steps; on verifier steps it carries no verdict,
    so it abstains there."""

    def __init__(self, config: TeacherConfig, problems: ProblemSource) -> None:
        super().__init__(config)
        self.problems = problems

    def respond(self, messages: list[dict[str, str]], problem_id: str) -> TeacherReply:
        try:
            problem = self.problems.get(problem_id)
        except UnknownProblemError as exc:
            raise RuntimeError(f"oracle teacher: {exc}") from None
        return TeacherReply(problem.solution)


def build_teacher(config: TeacherConfig, problems: ProblemSource | None = None) -> Teacher:
    """The teacher for a config.

    Raises:
        ValueError: an oracle without a problem source.
    """
    if config.kind == "openai":
        return OpenAITeacher(config)
    if config.kind == "hf":
        return HFTeacher(config)
    if problems is None:
        raise ValueError("the oracle teacher needs the problem source")
    return OracleTeacher(config, problems)


@dataclass(frozen=True)
class ReplayRequest:
    """A student step to replay to the teachers.

    Attributes:
        episode_id, t, role: the step.
        problem_id: the problem (for the oracle).
        messages: the exact ``state(t)`` chat the student's role saw on the server (what the
            teachers answer).
        student_response: what the student said at step ``t`` (its action content).
        student_answer: the answer extracted from it (``None`` if it gave none).
        context_ids: the rollout's token ids before the assistant message that produced step
            ``t`` (copied into the pair; empty when the caller has no rollout tokens).
        rejected_ids: the tokens the policy generated for that message (copied into the pair).
    """

    episode_id: str
    t: int
    role: Role
    problem_id: str
    messages: list[dict[str, str]]
    student_response: str
    student_answer: str | None
    context_ids: tuple[int, ...] = ()
    rejected_ids: tuple[int, ...] = ()


def extract_answer(role: Role, text: str) -> str | None:
    """The comparable answer of a response, read as the server reads it: the final answer
    (``answers.final_answer``: the last ``\\boxed{}``, or adjacent boxes merged) for solver and
    judge steps, the verdict for verifier steps."""
    return parse_verdict(text) if role is Role.VERIFIER else final_answer(text)


def score_disagreement(student_answer: str | None, teacher_answers: Sequence[str | None],
                       equivalent: Callable[[str, str], bool]) -> int | None:
    """Which teacher response, if any, becomes the chosen side of a DPO pair.

    Teacher answers are clustered by ``equivalent`` (``None`` agrees with nothing); the largest
    cluster of at least two wins (ties: the first formed). No such cluster: ``None`` (all
    disagree). The student agrees with it: ``None``.

    Args:
        student_answer: the student's answer (``None``: it gave none, which agrees with nothing).
        teacher_answers: one answer per teacher.
        equivalent: ``equivalent(a, b)``: whether ``b`` is the same answer as ``a`` (``a`` is
            treated as the gold: the env's grader is asymmetric).

    Returns:
        The index of a teacher in the winning cluster (its first member), or ``None``.
    """
    clusters: list[tuple[str, list[int]]] = []  # (the answer of its first member, its members)
    for i, answer in enumerate(teacher_answers):
        if answer is None:
            continue
        for first_answer, members in clusters:
            if equivalent(first_answer, answer):
                members.append(i)
                break
        else:
            clusters.append((answer, [i]))
    best = max(clusters, key=lambda cluster: len(cluster[1]), default=None)
    if best is None or len(best[1]) < 2:
        return None
    agreed, members = best
    if student_answer is not None and equivalent(agreed, student_answer):
        return None
    return members[0]


class AnswerEquivalence:
    """The env's grader (math-verify in worker processes with a hard kill) as a blocking
    ``equivalent(a, b)`` callable usable from any thread: the grader runs on a private event
    loop in a daemon thread (:class:`~env_server.client.sync.LoopThread`). Verdict strings
    compare by equality."""

    def __init__(self, workers: int = 1, timeout_s: float = 30.0) -> None:
        from env_server.grading.pool import Grader, GradingConfig

        self.timeout_s = timeout_s
        self._runner = LoopThread(name="teacher-grader")
        self._grader = Grader(GradingConfig(workers=workers))
        # the workers start and warm up now, and a grade waits for that (up to 10 min) before its
        # own timeout runs: a cold start on a loaded machine (a resumed run's first step) must not
        # fail or time out the first replays' grades, which a warm run would have made pairs of
        self._warm = self._runner.submit(self._grader.start())

    def __call__(self, gold: str, answer: str) -> bool:
        if gold in ("CORRECT", "INCORRECT") or answer in ("CORRECT", "INCORRECT"):
            return gold == answer
        if normalize_answer(gold) == normalize_answer(answer):
            return True
        wait([self._warm], timeout=600)
        return self._runner.run(self._grader.grade(gold, answer), self.timeout_s).correct

    def close(self) -> None:
        self._runner.call_soon(self._grader.close)
        self._runner.stop(timeout_s=10)


@dataclass
class _Replay:
    """A request in flight: one reply slot per teacher, and how many calls are still running."""

    step: int
    request: ReplayRequest
    replies: list[TeacherReply | None]
    remaining: int


class TeacherPool:
    """Teachers answering replayed steps in background threads.

    Args:
        teachers: the teachers (at least 2 for any pair to be possible).
        equivalent: answer equivalence (default: :class:`AnswerEquivalence`).
        budget_per_step: most teacher calls started per :meth:`submit_step`; requests beyond it
            are dropped (counted).
        max_workers: threads running teacher calls (all requests' calls share them; a
            request's teachers run in parallel).
        measure_against: the problem source, to *measure* the teachers (never to choose a
            pair): each teacher's accuracy on the solver and judge steps it answered
            (``teachers/<name>/accuracy``), the share of replays whose teachers agreed
            (``teachers/agreement``) and the pair precision, the share of chosen sides of
            solver and judge pairs whose answer is right (``pairs/precision``). ``None``: not
            measured.

    Attributes:
        failures: every endpoint teacher's request (:class:`OpenAITeacher`) and those that
            failed for good, by typed reason with the server's message
            (:class:`~env_server.client.failures.FailureTally`; a training run's exit rule reads
            it). A replay with a failed call, of any teacher, gives no pair.
    """

    def __init__(self, teachers: Sequence[Teacher], equivalent: Callable[[str, str], bool] | None = None,
                 budget_per_step: int = 16, max_workers: int = 4, measure_against: ProblemSource | None = None) -> None:
        self.teachers = list(teachers)
        self.measure_against = measure_against
        self.budget_per_step = budget_per_step
        self._owns_equivalence = equivalent is None
        self.equivalent = equivalent or AnswerEquivalence()
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="teacher")
        self._lock = threading.Lock()
        self._done: list[DpoPair] = []
        self._pending: set[Future[None]] = set()
        self._counters: Counter[str] = Counter()
        self._cost = 0.0
        #: every teacher call and the ones that failed for good, typed (a run's exit rule reads it)
        self.failures = FailureTally()

    @classmethod
    def from_configs(cls, configs: Sequence[TeacherConfig], problems: ProblemSource | None = None,
                     **kwargs: Any) -> TeacherPool:
        """A pool of teachers built from their configs (see :func:`build_teacher`), measured
        against ``problems`` when given (``measure_against``)."""
        kwargs.setdefault("measure_against", problems)
        teachers = [build_teacher(c, problems) for c in configs]
        for teacher in teachers:  # local models load here, never in a teacher thread (HFTeacher.load)
            if isinstance(teacher, HFTeacher):
                teacher.load()
        return cls(teachers, **kwargs)

    def submit_step(self, step: int, requests: Sequence[ReplayRequest]) -> None:
        """Queue replays of one training step's rollouts; returns at once. Each request costs
        one call per teacher; requests that would exceed the step's budget are dropped. Each
        call is its own task, so a request's teachers answer in parallel (up to ``max_workers``
        calls at a time across all requests, queued request by request)."""
        per_request = max(1, len(self.teachers))
        allowed = self.budget_per_step // per_request
        with self._lock:
            self._counters["teachers/dropped"] += max(0, len(requests) - allowed)
        for request in requests[:allowed]:
            replay = _Replay(step, request, [None] * len(self.teachers), len(self.teachers))
            if not self.teachers:  # nothing to ask: score at once (no pair)
                self._track(self._executor.submit(self._score, replay))
            for i in range(len(self.teachers)):
                self._track(self._executor.submit(self._call, replay, i))

    def _track(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("teacher replay failed: %s", future.exception())

    def _ask(self, teacher: Teacher, request: ReplayRequest) -> TeacherReply | None:
        """The teacher's reply, or ``None`` when its call failed for good (counted; an endpoint
        teacher's request also in :attr:`failures`, typed)."""
        endpoint = isinstance(teacher, OpenAITeacher)
        if endpoint:
            self.failures.request()
        try:
            reply = teacher.answer(request)
        except Exception as exc:  # a failing teacher must not stop the others
            if isinstance(exc, TimeoutError):
                self._count("teachers/timeouts")
            else:
                log.warning("teacher %s failed: %s", teacher.name, exc)
                self._count("teachers/failures")
            if endpoint:
                self.failures.fail(call_failure(exc))
            return None
        tokens = reply.prompt_tokens + reply.completion_tokens
        with self._lock:
            self._counters["teachers/calls"] += 1
            self._counters["teachers/tokens"] += tokens
            self._cost += tokens / 1000 * teacher.config.cost_per_1k_tokens
        return reply

    def _count(self, name: str) -> None:
        with self._lock:
            self._counters[name] += 1

    def _call(self, replay: _Replay, i: int) -> None:
        """One teacher's call for one request; the request's last call to finish scores it."""
        reply = self._ask(self.teachers[i], replay.request)
        with self._lock:
            replay.replies[i] = reply
            replay.remaining -= 1
            last = replay.remaining == 0
        if last:
            self._score(replay)

    def _score(self, replay: _Replay) -> None:
        """Score a request whose teachers all answered (or failed): emit a pair on a disagreement;
        none when a call failed (a failed request is not an answer: the vote is incomplete)."""
        request, replies = replay.request, replay.replies
        self._count("teachers/replays")
        if any(reply is None for reply in replies):  # a call failed: not an answer, so no vote and no pair
            self._count("teachers/failed_replays")
            return
        answers = [extract_answer(request.role, r.text) if r is not None else None for r in replies]
        chosen = score_disagreement(request.student_answer, answers, self.equivalent)
        pair_correct = self._measure(request, answers, chosen)
        if chosen is None:
            return
        reply = replies[chosen]
        assert reply is not None, "a teacher without a reply has no answer, so it is never chosen"
        agreed = answers[chosen]
        assert agreed is not None, "the chosen teacher is in the agreeing cluster, so it has an answer"
        # gold-supervised: an oracle (the reference solution) is in the agreeing majority
        gold = any(self.teachers[i].config.kind == "oracle" and answer is not None
                   and (i == chosen or self.equivalent(agreed, answer))
                   for i, answer in enumerate(answers))
        pair = DpoPair(prompt_messages=request.messages, chosen=reply.text,
                       rejected=request.student_response, episode_id=request.episode_id, t=request.t,
                       role=request.role, teacher=self.teachers[chosen].name, created_step=replay.step,
                       context_ids=list(request.context_ids) or None, rejected_ids=list(request.rejected_ids) or None,
                       gold_supervised=gold)
        with self._lock:
            self._done.append(pair)
            self._counters["pairs/emitted"] += 1
            self._counters["pairs/gold_supervised"] += gold
            if pair_correct is not None:
                self._counters["pairs/graded"] += 1
                self._counters["pairs/correct"] += pair_correct

    def _measure(self, request: ReplayRequest, answers: list[str | None], chosen: int | None) -> bool | None:
        """Count each teacher's answers and right answers, and whether the teachers agreed;
        return whether the chosen answer is right (``None``: not measured: no source, a
        verifier step, or no pair)."""
        agreed = any(a is not None and b is not None and self.equivalent(a, b)
                     for i, a in enumerate(answers) for b in answers[i + 1:])
        self._count("teachers/agreed_replays" if agreed else "teachers/split_replays")
        if self.measure_against is None or request.role is Role.VERIFIER:
            return None
        try:
            gold = self.measure_against.get(request.problem_id).answer
        except UnknownProblemError:
            return None
        right = [answer is not None and self.equivalent(gold, answer) for answer in answers]
        with self._lock:
            for teacher, answer, ok in zip(self.teachers, answers, right, strict=True):
                if answer is not None:
                    self._counters[f"teachers/{teacher.name}/answered"] += 1
                    self._counters[f"teachers/{teacher.name}/correct"] += ok
        return None if chosen is None else right[chosen]

    def collect(self) -> list[DpoPair]:
        """Pairs finished since the last call (never blocks)."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def wait(self, timeout_s: float = 60.0) -> bool:
        """Block until queued replays finish or ``timeout_s`` seconds pass (checkpoints,
        shutdown, tests). Returns whether none is left; never raises."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return True
            if time.monotonic() > deadline:
                return False
            try:
                pending[0].exception(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False

    def counters(self) -> dict[str, float]:
        """Counters for logging: calls, tokens, cost (USD), failures, timeouts, replays and the
        ones with a failed call (``teachers/failed_replays``: no pair), drops, pairs
        (``pairs/emitted``, of which ``pairs/gold_supervised``), and with ``measure_against``
        the measurements (running totals): ``teachers/<name>/accuracy``, ``teachers/agreement``,
        ``pairs/precision`` (see :class:`TeacherPool`)."""
        with self._lock:
            counters = {**{k: float(v) for k, v in self._counters.items()}, "teachers/cost_usd": self._cost}
        for teacher in self.teachers:
            answered = counters.get(f"teachers/{teacher.name}/answered", 0.0)
            if answered:
                counters[f"teachers/{teacher.name}/accuracy"] = counters.get(f"teachers/{teacher.name}/correct", 0.0) / answered
        replays = counters.get("teachers/agreed_replays", 0.0) + counters.get("teachers/split_replays", 0.0)
        if replays:
            counters["teachers/agreement"] = counters.get("teachers/agreed_replays", 0.0) / replays
        if counters.get("pairs/graded"):
            counters["pairs/precision"] = counters.get("pairs/correct", 0.0) / counters["pairs/graded"]
        return counters

    def state_dict(self) -> dict[str, Any]:
        """The calls, tokens and cost used so far, for a checkpoint (:meth:`counters`' values)."""
        with self._lock:
            return {"counters": dict(self._counters), "cost_usd": self._cost}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the counters of a checkpoint's :meth:`state_dict` (a resumed run)."""
        with self._lock:
            self._counters = Counter({k: int(v) for k, v in state["counters"].items()})
            self._cost = float(state["cost_usd"])

    def close(self) -> None:
        """Stop the threads (queued replays are cancelled) and the grader."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._owns_equivalence and isinstance(self.equivalent, AnswerEquivalence):
            self.equivalent.close()
