"""Problem statements and reference answers of exported episodes: from the line when it carries
them (eval outputs), else from the problem source the server served (``--problems``), with the
built-in generator's ids (``gen/<family>/<seed>``) always resolvable."""

from __future__ import annotations

from env_server.debate.problems import Problem, ProblemSource, find_problem, load_problem_source

__all__ = ["ProblemLookup"]


class ProblemLookup:
    """Find a problem by id.

    Args:
        spec: the server's ``--problems`` (``load_problem_source``'s spec: a JSONL path,
            ``gen:<families>``, ``hf:<name>``); ``None``: only the built-in generator.

    Raises:
        FileNotFoundError, ValueError: ``spec`` cannot be loaded (from ``load_problem_source``).
    """

    def __init__(self, spec: str | None = None) -> None:
        self._sources: list[ProblemSource] = [] if spec is None else [load_problem_source(spec)]

    def get(self, problem_id: str) -> Problem | None:
        """The problem with this id, or ``None`` when no source holds it (:func:`find_problem`)."""
        return find_problem(problem_id, self._sources)
