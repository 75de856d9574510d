"""The problem contract shared by every problem source (generator, JSONL files, HF datasets)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import astuple, dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One math problem.

    Attributes:
        problem_id: stable id; ``reset(problem_id=...)`` replays it. MATH-500: the file's
            ``unique_id`` (e.g. ``test/precalculus/807.json``); GSM8K: ``gsm8k/test/<line>``;
            generator: ``gen/<family>/<seed>``.
        problem: the statement shown to the debaters (LaTeX in Markdown).
        answer: the reference answer in LaTeX, without ``\\boxed{}`` (the grader's gold).
        solution: a reference solution whose last ``\\boxed{}`` holds the answer, used by the
            scripted ``reference`` policy of ``mathdebate play``; never shown to a policy.
        subject, level: optional labels (MATH-500 has both).
        source: ``"generator"``, ``"math500"``, ``"gsm8k"`` or ``"hf"``.
    """

    problem_id: str
    problem: str
    answer: str
    solution: str
    subject: str | None = None
    level: int | None = None
    source: str = ""


class UnknownProblemError(KeyError):
    """Raised by :meth:`ProblemSource.get` for an id the source does not hold."""


class ProblemSource(ABC):
    """A set of problems, addressable by id and by seed.

    Implementations are immutable after construction and safe to share between sessions.
    """

    #: short human-readable name, shown by ``GET /metadata`` and ``mathdebate play``.
    name: str = "problems"

    @abstractmethod
    def get(self, problem_id: str) -> Problem:
        """Return the problem with this id.

        Raises:
            UnknownProblemError: no such problem.
        """

    @abstractmethod
    def by_seed(self, seed: int) -> Problem:
        """Return the problem for a non-negative integer seed, deterministically.

        Finite sources map ``seed`` onto their problems (``seed % len``); the generator
        produces a fresh problem per seed.
        """

    @abstractmethod
    def __len__(self) -> int:
        """Number of distinct problems (the generator reports its seed space)."""

    def fingerprint_problems(self) -> list[Problem]:
        """The problems :meth:`fingerprint` hashes: all of them for a finite source (override
        where that is too many); the generator hashes a sample."""
        return [self.by_seed(seed) for seed in range(len(self))]

    def fingerprint(self) -> str:
        """A hex SHA-256 of this source's name, size and problems (ids, statements, answers):
        a state journal written for one source refuses another (``--state-dir``)."""
        digest = hashlib.sha256(f"{self.name}\0{len(self)}".encode())
        for problem in self.fingerprint_problems():
            for value in astuple(problem):
                digest.update(b"\0" + str(value).encode())
        return digest.hexdigest()[:32]
