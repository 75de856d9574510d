"""The refusals of ``mathdebate export``: one typed error per kind of bad input, each a
``ValueError`` whose message names the file (and the line) to look at."""

from __future__ import annotations

from pathlib import Path

__all__ = ["EmptySourceError", "ExportError", "MalformedLineError", "MissingProblemError", "UnknownSourceError"]


class ExportError(ValueError):
    """Base of every export refusal (the CLI prints its message and exits 2)."""


class UnknownSourceError(ExportError):
    """The path is none of the layouts ``export`` reads (a trajectory JSONL file, an eval output
    directory, a training run directory, an ablation directory), or does not exist.

    Attributes:
        path: the path given.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class EmptySourceError(ExportError):
    """A source holds nothing to export (an empty log, a run directory without pairs).

    Attributes:
        path: the source.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class MalformedLineError(ExportError):
    """A line of a JSONL source is not what its layout says (not JSON, a missing field, a record
    that does not validate, turns that are not a possible debate).

    Attributes:
        path: the file.
        line: the 1-based line number.
        reason: what is wrong, in a few words.
    """

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}, line {line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class MissingProblemError(ExportError):
    """An episode's problem statement is neither in its line nor in the problem source, so its
    role chats cannot be rebuilt.

    Attributes:
        path: the file.
        line: the 1-based line number.
        problem_id: the problem the line names.
    """

    def __init__(self, path: Path, line: int, problem_id: str) -> None:
        super().__init__(f"{path}, line {line}: problem {problem_id!r} is not in the line nor in the problem source: "
                         "pass the server's --problems to export")
        self.path = path
        self.line = line
        self.problem_id = problem_id
