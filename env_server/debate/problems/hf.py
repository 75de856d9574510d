"""Optional Hugging Face ``datasets`` loader (``pip install 'mathdebate[hf]'``).

Columns are detected like the JSONL loader's: MATH style (``problem``, ``answer``,
``unique_id``) or GSM8K style (``question``, ``answer``). Datasets without ids get
``<name>/<row>`` ids.
"""

from __future__ import annotations

from typing import Any

from env_server.debate.problems.jsonl import ListProblems, problem_from_record

__all__ = ["load_hf_problems", "problems_from_dataset"]


def problems_from_dataset(dataset: Any, name: str) -> ListProblems:
    """Problems from an already-loaded ``datasets.Dataset`` (or any iterable of dicts).

    Raises:
        ValueError: a row matches neither format (with its index).
    """
    problems = []
    for index, row in enumerate(dataset):
        record = dict(row)
        if "problem" in record and "unique_id" not in record:
            record["unique_id"] = f"{name}/{index}"
        try:
            problems.append(problem_from_record(record, index, source="hf"))
        except ValueError as exc:
            raise ValueError(f"{name} row {index}: {exc}") from None
    return ListProblems(problems, name=name)


def load_hf_problems(name_or_path: str, split: str = "test", config: str | None = None) -> ListProblems:
    """Load a dataset with ``datasets.load_dataset(name_or_path, config, split=split)``.

    Raises:
        ImportError: ``datasets`` is not installed.
    """
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the Hugging Face loader needs `datasets`: pip install 'mathdebate[hf]'") from exc
    dataset = datasets.load_dataset(name_or_path, config, split=split)
    return problems_from_dataset(dataset, name=f"{name_or_path}:{split}")
