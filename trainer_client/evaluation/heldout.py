"""Held-out evaluation of a policy's first answer: one code path for every measurement.

For each problem (``source.by_seed(seed)``, held-out seeds are ``>= HELDOUT_SEED_BASE``) the
solver's prompt is built exactly as TRL's tool loop builds a rollout's prompt: the system
message :data:`~trainer_client.rollout.environment.DEBATE_SYSTEM_PROMPT`, a user message holding
:func:`~trainer_client.rollout.environment.render_instructions` of the reset observation (played locally with
the server's own :class:`~env_server.debate.episode.DebateEpisode`), the environment's tools, and
``apply_chat_template(..., tools=..., add_generation_prompt=True)``. The model generates the
solver's first turn (greedy, and optionally ``k`` samples at a temperature for pass@k, in
left-padded batches); the first ``<tool_call>{json}</tool_call>`` block (the qwen3 template's
format, as TRL's response schema reads it) must call ``submit_solution`` with exactly a
``solution`` string; its final answer is read with the server's
:func:`~env_server.debate.answers.final_answer` (the last ``\\boxed{}``, or adjacent boxes merged) and
graded against the problem's answer with the server's grader (its exact/closed-form fast paths,
then math-verify in process). Model output is never evaluated as code.

First-answer accuracy counts an answer only when it came through a well-formed
``submit_solution`` call; a turn without one is format-invalid and wrong. (In training the
environment would still submit a tool-less reply as the solver's action; here it does not count.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from env_server.debate.answers import final_answer
from env_server.debate.problems import Problem, ProblemSource, splits
from env_server.grading.pool import Grader, GradingConfig
from trainer_client.rollout.tool_calls import END_OF_TURN, role_tool_action
from trainer_client.rollout.tool_calls import read_tool_call as _read_call

__all__ = [
    "HELDOUT_SEED_BASE",
    "HeldoutRecord",
    "HeldoutReport",
    "SolverTurn",
    "evaluate_first_answers",
    "extend_context",
    "generate_turns",
    "grade_answer_text",
    "heldout_seeds",
    "majority_vote_correct",
    "observation_prompt_ids",
    "own_text",
    "read_solver_turn",
    "role_tool_action",
    "solver_prompt_ids",
]

#: Held-out problems use seeds from here up; warm-up and RL training seeds stay below it
#: (:mod:`env_server.debate.problems.splits`; validation seeds start at ``VALIDATION_SEED_BASE``).
HELDOUT_SEED_BASE = splits.HELDOUT_SEED_BASE



def heldout_seeds(n: int, start: int = 0) -> list[int]:
    """``n`` held-out seeds: ``HELDOUT_SEED_BASE + start + i``."""
    return [HELDOUT_SEED_BASE + start + i for i in range(n)]


@dataclass(frozen=True)
class SolverTurn:
    """What a generated solver turn amounts to.

    Attributes:
        tool: name of the first tool call (``None``: no parsable call).
        solution: its ``solution`` argument when the call is a well-formed ``submit_solution``.
        answer: the last ``\\boxed{}`` of the solution (``None``: no box, or no valid call).
    """

    tool: str | None
    solution: str | None
    answer: str | None

    @property
    def valid(self) -> bool:
        """A parsable ``submit_solution`` call whose solution has a boxed answer."""
        return self.answer is not None


def read_solver_turn(text: str) -> SolverTurn:
    """Parse a generated solver turn (decoded with special tokens; stops at ``<|im_end|>``)."""
    name, arguments = _read_call(text)
    if name is None:
        return SolverTurn(None, None, None)
    if (name != "submit_solution" or arguments is None or set(arguments) != {"solution"}
            or not isinstance(arguments["solution"], str)):
        return SolverTurn(name, None, None)
    solution = arguments["solution"]
    return SolverTurn("submit_solution", solution, final_answer(solution))


_GRADER: Grader | None = None


def grade_answer_text(gold: str, answer: str | None) -> bool:
    """The server's verdict on an extracted answer: its grader's rule/exact/closed-form paths,
    else math-verify (``grading_worker.grade_answer``) in this process."""
    global _GRADER
    if _GRADER is None:
        _GRADER = Grader(GradingConfig(workers=1))  # never started: only its synchronous fast paths run
    quick = _GRADER.quick_grade(gold, answer)
    if quick is not None:
        return quick.correct
    from env_server.grading.worker import grade_answer

    assert answer is not None  # quick_grade decides a missing answer
    config = _GRADER.config
    correct, _kind = grade_answer(gold, answer, config.sig_figs, config.soft_timeout_s)
    return bool(correct)


def observation_prompt_ids(tokenizer: Any, observation: Any, tools: Sequence[Any] | None = None) -> list[int]:
    """Token ids of a rollout's first prompt for an observation (a
    :class:`~env_server.protocol.models.DebateObservation`), as TRL's tool loop renders it: the system
    message :data:`~trainer_client.rollout.environment.DEBATE_SYSTEM_PROMPT`, a user message holding
    :func:`~trainer_client.rollout.environment.render_instructions` of the observation, the environment's tools,
    the generation prompt, with the training chat template."""
    from trainer_client.rollout.chat_template import training_chat_template
    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT, render_instructions

    messages = [{"role": "system", "content": DEBATE_SYSTEM_PROMPT},
                {"role": "user", "content": "" + render_instructions(observation)}]
    return list(tokenizer.apply_chat_template(messages, tools=list(tools if tools is not None else tool_callables()),
                                              add_generation_prompt=True, tokenize=True, return_dict=False,
                                              chat_template=training_chat_template(tokenizer)))


def solver_prompt_ids(tokenizer: Any, problem: Problem, tools: Sequence[Any] | None = None,
                      max_rounds: int = 1, mode: str = "debate") -> list[int]:
    """Token ids of the solver's first prompt, as TRL's tool loop renders it for a rollout of
    an episode in ``mode`` (``debate`` or ``single``: the solver's instructions differ, RFC 0006)."""
    return observation_prompt_ids(tokenizer, _reset_observation(problem, max_rounds, mode), tools)


def solver_instructions(problem: Problem, max_rounds: int = 1, mode: str = "debate") -> str:
    """The solver's first instructions for ``problem`` (``render_instructions`` of the reset
    observation): the text TRL appends to the prompt, and what a restated hint repeats."""
    from trainer_client.rollout.tools import render_instructions

    return render_instructions(_reset_observation(problem, max_rounds, mode))


def _reset_observation(problem: Problem, max_rounds: int, mode: str) -> Any:
    """The reset observation (a ``DebateObservation``) of a local episode on ``problem``."""
    from env_server.debate.episode import DebateEpisode
    from env_server.protocol.markers import EpisodeMode
    from env_server.protocol.models import DebateObservation

    episode = DebateEpisode("heldout", problem, max_rounds=max_rounds, max_action_chars=4096, mode=EpisodeMode(mode))
    return DebateObservation.model_validate(json.loads(episode.last_observation)["observation"])


def own_text(text: str) -> str:
    """A generated turn's text up to its end-of-turn token."""
    return text.split(END_OF_TURN, 1)[0]


def extend_context(tokenizer: Any, context: list[int], text: str, next_observation: Any | None,
                   role: Any, template: str | None) -> list[int]:
    """The rollout context after a played turn, as TRL's tool loop lays it out: the context,
    the turn's own tokens (:func:`own_text` re-tokenised) and the end-of-turn token, then (when
    the episode goes on, ``next_observation`` not ``None``) the tool-result suffix holding
    :func:`~trainer_client.rollout.environment.render_instructions` of the next observation under the name of
    ``role``'s tool."""
    from trainer_client.rollout.chat_template import tool_result_suffix
    from trainer_client.rollout.tools import TOOL_FOR_ROLE, render_instructions

    ids = [*context, *tokenizer(own_text(text), add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    if next_observation is not None:
        ids += tool_result_suffix(tokenizer, {"role": "tool", "name": TOOL_FOR_ROLE[role],
                                              "content": render_instructions(next_observation)}, template)
    return ids


@dataclass
class HeldoutRecord:
    """One problem's result: the greedy turn and, with ``k > 0``, the sampled turns."""

    problem_id: str
    problem: str
    gold: str
    completion: str
    tool: str | None
    answer: str | None
    valid: bool
    correct: bool
    sample_answers: list[str | None] = field(default_factory=list)
    sample_correct: list[bool] = field(default_factory=list)
    tokens: int = 0
    sample_tokens: list[int] = field(default_factory=list)
    majority_correct: list[bool] = field(default_factory=list)


@dataclass
class HeldoutReport:
    """Aggregates over the records.

    Attributes:
        accuracy: greedy first-answer accuracy (a valid call with a correct boxed answer).
        valid_rate: share of greedy turns that are a valid ``submit_solution`` with a box.
        accuracy_valid: accuracy among the valid greedy turns (0 when none is valid).
        pass_at_k: share of problems with at least one correct sample among ``k`` (``None``
            when ``k == 0``).
        sample_accuracy: mean correctness of the samples (pass@1 at ``temperature``).
        sample_valid_rate: share of samples that are valid.
        seconds: wall-clock of the whole evaluation.
        mean_tokens: generated tokens of a greedy first answer, mean over problems.
        mean_sample_tokens: generated tokens of a sample, mean (``None`` when ``k == 0``).
        majority_accuracy_by_k: entry ``m − 1`` is the accuracy of the majority vote over each
            problem's first ``m`` samples, ``m = 1 .. k`` (self-consistency, X. Wang et al.
            2023, with the grader's clusters: :func:`~trainer_client.evaluation.selection.
            self_consistency_choice`; a problem whose samples have no answer counts as wrong);
            ``None`` when ``k == 0``. A record's ``majority_correct`` holds its ``k`` votes.
    """

    n: int
    accuracy: float
    valid_rate: float
    accuracy_valid: float
    k: int
    temperature: float
    pass_at_k: float | None
    sample_accuracy: float | None
    sample_valid_rate: float | None
    seconds: float
    records: list[HeldoutRecord]
    mean_tokens: float = 0.0
    mean_sample_tokens: float | None = None
    majority_accuracy_by_k: list[float] | None = None

    def summary(self) -> dict[str, Any]:
        """The aggregates without the records."""
        return {k: v for k, v in asdict(self).items() if k != "records"}


def generate_turns(model: Any, tokenizer: Any, prompts: list[list[int]], *, sample: bool, num: int, temperature: float,
                   max_new_tokens: int, token_counts: list[int] | None = None) -> list[list[str]]:
    """Decoded continuations (special tokens kept), ``num`` per prompt, from one left-padded
    batch on the model's device: greedy, or sampled at ``temperature`` (``top_k`` 0, ``top_p`` 1).

    ``token_counts``, when given, gets each continuation's generated token count appended, in
    the order of the flattened result (prompt-major): the tokens up to and including the first
    end-of-sequence token, or all ``max_new_tokens`` without one (the inference tokens a turn
    costs)."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention[row, width - len(ids):] = 1
    options: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0, "num_return_sequences": num}
        if sample else {"do_sample": False}
    )
    device = next(model.parameters()).device
    input_ids, attention = input_ids.to(device), attention.to(device)
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **options)
    generated = out[:, width:]
    if token_counts is not None:
        eos = tokenizer.eos_token_id
        ends = generated == eos if eos is not None else torch.zeros_like(generated, dtype=torch.bool)
        first_end = torch.where(ends.any(-1), ends.int().argmax(-1) + 1, torch.full_like(ends[:, 0], generated.shape[1],
                                                                                      dtype=torch.long))
        token_counts.extend(int(x) for x in first_end.tolist())
    texts = tokenizer.batch_decode(generated, skip_special_tokens=False)
    return [texts[i * num:(i + 1) * num] for i in range(len(prompts))]


def evaluate_first_answers(model: Any, tokenizer: Any, source: ProblemSource, seeds: Sequence[int], *, k: int = 0,
                           temperature: float = 1.0, batch_size: int = 64, max_new_tokens: int = 96,
                           sample_seed: int = 0, max_rounds: int = 1, mode: str = "debate",
                           progress: bool | None = None, label: str = "held-out first answers") -> HeldoutReport:
    """Greedy first-answer accuracy (and pass@k at ``temperature`` with ``k`` samples) on
    ``source.by_seed(s)`` for ``s`` in ``seeds``.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (chat template with tools).
        source: the problem source the server serves.
        seeds: problem seeds (held-out: :func:`heldout_seeds`).
        k: samples per problem for pass@k (0: greedy only).
        temperature: sampling temperature of the samples.
        batch_size: prompts per generation batch (left padding).
        max_new_tokens: longest generated turn.
        sample_seed: torch seed for the samples (reproducible).
        max_rounds: the episode's rounds (the solver's first instructions do not depend on it).
        mode: the episode mode the policy was trained in (``debate`` or ``single``): the
            solver's first prompt is that mode's, as in training.
        progress: a progress bar over the problems (tqdm, on stderr): ``None`` on a terminal
            only, ``True`` always, ``False`` never.
        label: the bar's description.
    """
    import torch
    from tqdm.auto import tqdm

    from trainer_client.rollout.tool_calls import tool_callables

    start = time.perf_counter()
    was_training = model.training
    model.train(False)
    tools = tool_callables()
    problems = [source.by_seed(s) for s in seeds]
    prompts = [solver_prompt_ids(tokenizer, p, tools, max_rounds, mode) for p in problems]
    greedy: list[str] = []
    samples: list[list[str]] = []
    greedy_tokens: list[int] = []
    sample_tokens: list[int] = []
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(sample_seed)
    bar = tqdm(total=len(prompts), desc=label, unit="problem", disable=None if progress is None else not progress)
    try:
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i:i + batch_size]
            greedy += [texts[0] for texts in generate_turns(model, tokenizer, batch, sample=False, num=1,
                                                       temperature=temperature, max_new_tokens=max_new_tokens,
                                                       token_counts=greedy_tokens)]
            if k:
                samples += generate_turns(model, tokenizer, batch, sample=True, num=k, temperature=temperature,
                                     max_new_tokens=max_new_tokens, token_counts=sample_tokens)
            bar.update(len(batch))
    finally:
        bar.close()
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    records = []
    for j, problem in enumerate(problems):
        turn = read_solver_turn(greedy[j])
        sample_turns = [read_solver_turn(t) for t in samples[j]] if k else []
        answers = [t.answer if t.valid else None for t in sample_turns]
        records.append(HeldoutRecord(
            problem_id=problem.problem_id, problem=problem.problem, gold=problem.answer, completion=greedy[j],
            tool=turn.tool, answer=turn.answer, valid=turn.valid,
            correct=turn.valid and grade_answer_text(problem.answer, turn.answer),
            sample_answers=[t.answer for t in sample_turns],
            sample_correct=[t.valid and grade_answer_text(problem.answer, t.answer) for t in sample_turns],
            tokens=greedy_tokens[j], sample_tokens=sample_tokens[j * k:(j + 1) * k],
            majority_correct=[majority_vote_correct(problem.answer, answers[:m]) for m in range(1, k + 1)],
        ))
    n = len(records)
    valid = [r for r in records if r.valid]
    all_samples = [c for r in records for c in r.sample_correct]
    return HeldoutReport(
        n=n,
        accuracy=sum(r.correct for r in records) / n if n else 0.0,
        valid_rate=len(valid) / n if n else 0.0,
        accuracy_valid=sum(r.correct for r in valid) / len(valid) if valid else 0.0,
        k=k,
        temperature=temperature,
        pass_at_k=sum(any(r.sample_correct) for r in records) / n if k and n else None,
        sample_accuracy=sum(all_samples) / len(all_samples) if all_samples else None,
        sample_valid_rate=(sum(a is not None for r in records for a in r.sample_answers) / len(all_samples)
                           if all_samples else None),
        seconds=time.perf_counter() - start,
        records=records,
        mean_tokens=sum(r.tokens for r in records) / n if n else 0.0,
        mean_sample_tokens=sum(sample_tokens) / len(sample_tokens) if sample_tokens else None,
        majority_accuracy_by_k=[sum(r.majority_correct[m] for r in records) / n for m in range(k)] if k and n else None,
    )


def majority_vote_correct(gold: str, answers: Sequence[str | None]) -> bool:
    """Whether the majority vote over ``answers`` (self-consistency with the grader's clusters,
    :func:`~trainer_client.evaluation.selection.self_consistency_choice`) is right; ``False``
    when no answer was given."""
    from trainer_client.evaluation.selection import self_consistency_choice

    if not any(a is not None for a in answers):
        return False
    chosen, _ = self_consistency_choice(answers, lambda head, other: grade_answer_text(head, other))
    return grade_answer_text(gold, answers[chosen])
