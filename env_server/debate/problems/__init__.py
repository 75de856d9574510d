"""Problem sources: the built-in generator (default), JSONL files (MATH-500 / GSM8K format) and
an optional Hugging Face ``datasets`` loader."""

from __future__ import annotations

from env_server.debate.problems.base import Problem, ProblemSource, UnknownProblemError
from env_server.debate.problems.generator import ProblemGenerator
from env_server.debate.problems.jsonl import JsonlProblems, ListProblems

__all__ = [
    "JsonlProblems",
    "ListProblems",
    "Problem",
    "ProblemGenerator",
    "ProblemSource",
    "UnknownProblemError",
    "find_problem",
    "load_problem_source",
]


def load_problem_source(spec: str | None) -> ProblemSource:
    """Build the problem source named by ``spec``.

    Args:
        spec: ``None`` for the built-in generator; ``gen:<family>[,<family>...]`` for the
            generator restricted to these families (``EXTRA_FAMILIES`` included, e.g.
            ``gen:single_digit_sum``); a path to a ``.jsonl`` file (MATH-500 or GSM8K format);
            or ``hf:<dataset>[:<split>]`` for a Hugging Face dataset.

    Raises:
        FileNotFoundError, ValueError: from the loaders.
    """
    if spec is None:
        return ProblemGenerator()
    if spec.startswith("gen:"):
        return ProblemGenerator(families=[name.strip() for name in spec[4:].split(",") if name.strip()])
    if spec.startswith("hf:"):
        from env_server.debate.problems.hf import load_hf_problems

        name, _, split = spec[3:].partition(":")
        return load_hf_problems(name, split or "test")
    return JsonlProblems.from_path(spec)


def find_problem(problem_id: str, sources: list[ProblemSource] | None = None) -> Problem | None:
    """The problem with ``problem_id`` from the first of ``sources`` that holds it, else, for a
    generated id (``gen/<family>/<seed>``), from the generator with every family (the default
    rotation, the extra and the split families); ``None`` when nothing holds it."""
    from env_server.debate.problems.generator import EXTRA_FAMILIES, FAMILIES, SPLIT_FAMILIES

    candidates = list(sources or [])
    if problem_id.startswith("gen/"):
        candidates.append(ProblemGenerator(families=[*FAMILIES, *EXTRA_FAMILIES, *SPLIT_FAMILIES]))
    for source in candidates:
        try:
            return source.get(problem_id)
        except (UnknownProblemError, ValueError):
            continue
    return None
