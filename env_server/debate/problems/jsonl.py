"""Problem files: JSONL in MATH-500 format or GSM8K format, loaded into memory."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from env_server.debate.problems.base import Problem, ProblemSource, UnknownProblemError
from env_server.jsonio import read_jsonl

__all__ = ["JsonlProblems", "ListProblems", "gsm8k_answer", "gsm8k_solution", "problem_from_record"]

_CALCULATOR = re.compile(r"<<[^<>]*>>")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def gsm8k_answer(answer_field: str) -> str:
    """The final answer of a GSM8K ``answer`` field: the text after ``####``, without
    thousands separators (``#### 1,000`` -> ``1000``).

    Raises:
        ValueError: no ``####`` marker.
    """
    if "####" not in answer_field:
        raise ValueError("GSM8K answer has no '#### <answer>' line")
    return _THOUSANDS.sub("", answer_field.rsplit("####", 1)[1].strip())


def gsm8k_solution(answer_field: str) -> str:
    """The GSM8K rationale without calculator annotations (``<<3*4=12>>``), ending with the
    answer in ``\\boxed{}``."""
    rationale = _CALCULATOR.sub("", answer_field.rsplit("####", 1)[0]).strip()
    return f"{rationale}\nThe answer is $\\boxed{{{gsm8k_answer(answer_field)}}}$."


def problem_from_record(record: Mapping[str, Any], index: int, source: str) -> Problem:
    """One problem from a MATH-style (``problem``/``answer``/``unique_id``) or GSM8K-style
    (``question``/``answer``) record.

    Args:
        record: the parsed JSON object.
        index: position among the source's records (GSM8K ids are ``gsm8k/<index>``).
        source: ``"math500"``-like label for MATH-style records (GSM8K records are ``"gsm8k"``).

    Raises:
        ValueError: a required key is missing or empty, or the record matches neither format.
    """
    if "problem" in record:
        for key in ("problem", "answer", "unique_id"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise ValueError(f"MATH-format record needs a non-empty string {key!r}")
        answer = record["answer"].strip()
        solution = record.get("solution") or f"The answer is $\\boxed{{{answer}}}$."
        level = record.get("level")
        return Problem(
            problem_id=record["unique_id"], problem=record["problem"], answer=answer, solution=solution,
            subject=record.get("subject"), level=int(level) if isinstance(level, (int, str)) and str(level).isdigit() else None,
            source=source,
        )
    if "question" in record:
        if not isinstance(record.get("answer"), str):
            raise ValueError("GSM8K-format record needs a string 'answer'")
        return Problem(
            problem_id=f"gsm8k/{index}", problem=record["question"], answer=gsm8k_answer(record["answer"]),
            solution=gsm8k_solution(record["answer"]), source="gsm8k",
        )
    raise ValueError(f"unrecognised record (keys {sorted(record)}): expected MATH format "
                     "(problem, answer, unique_id) or GSM8K format (question, answer)")


class ListProblems(ProblemSource):
    """An in-memory list of problems, addressable by id and by seed.

    Args:
        problems: the problems, in order.
        name: shown by ``GET /metadata`` and ``play``.

    Raises:
        ValueError: empty, or duplicate ids.
    """

    def __init__(self, problems: Iterable[Problem], name: str) -> None:
        self._problems = list(problems)
        if not self._problems:
            raise ValueError(f"{name}: no problems")
        self._by_id: dict[str, Problem] = {}
        for problem in self._problems:
            if problem.problem_id in self._by_id:
                raise ValueError(f"{name}: duplicate problem id {problem.problem_id!r}")
            self._by_id[problem.problem_id] = problem
        self.name = name

    def __len__(self) -> int:
        return len(self._problems)

    def __iter__(self) -> Iterator[Problem]:
        return iter(self._problems)

    def ids(self) -> list[str]:
        return [p.problem_id for p in self._problems]

    def get(self, problem_id: str) -> Problem:
        try:
            return self._by_id[problem_id]
        except KeyError:
            raise UnknownProblemError(f"unknown problem id {problem_id!r} in {self.name}") from None

    def by_seed(self, seed: int) -> Problem:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return self._problems[seed % len(self._problems)]


class JsonlProblems(ListProblems):
    """Problems from a JSONL file (format detected per record: MATH-500 or GSM8K)."""

    @classmethod
    def from_path(cls, path: str | Path) -> JsonlProblems:
        """Load a JSONL file.

        Raises:
            FileNotFoundError: no such file.
            ValueError: invalid JSON, a malformed record or duplicate ids (with the line number),
                or an empty file.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"problems file not found: {path}")
        source = "math500" if "math" in path.stem.lower() else path.stem
        problems = []
        # a line that is not JSON: JSONLineError (a ValueError) with its number
        for index, (lineno, record) in enumerate(read_jsonl(path)):
            try:
                if not isinstance(record, dict):
                    raise ValueError("a line must be a JSON object")
                problems.append(problem_from_record(record, index, source))
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
        try:
            return cls(problems, name=path.name)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
