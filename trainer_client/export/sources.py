"""What ``mathdebate export`` reads, told apart by layout:

- a JSONL **file**: the server's ``--trajectory-log``, an eval ``trajectories.jsonl`` (episode
  lines), or a pair store (``replay_pairs.jsonl``: pair lines), by its first line;
- an **eval output** directory (``mathdebate eval --output-dir``): ``results.json`` and
  ``trajectories.jsonl``;
- a **training run** directory (``mathdebate train --output-dir``): ``config.yaml`` and the pair
  files it names (:func:`trainer_client.export.pairs.run_pair_files`);
- an **ablation** directory (``mathdebate ablate --output-dir``): ``runs/<arm>/seed<k>/``, each
  a training run (the ``sft`` control's runs have no config and no pairs: skipped, noted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trainer_client.export.errors import EmptySourceError, UnknownSourceError
from trainer_client.export.pairs import PairFile, looks_like_pairs, run_pair_files

__all__ = ["Source", "SourceKind", "detect_source"]

SourceKind = Literal["trajectory_log", "eval", "pairs", "run", "ablate"]


@dataclass
class Source:
    """One source and the files to read from it.

    Attributes:
        path: as given.
        kind: its layout.
        episode_files: JSONL files of episode lines.
        pair_files: pair store files.
        gold_supervised: what the source says of gold supervision as a whole: ``True``/``False``
            when it says, ``None`` when it does not (a server log records no author).
        notes: what the dataset card should say about it (policies, runs skipped, ...).
    """

    path: Path
    kind: SourceKind
    episode_files: list[Path] = field(default_factory=list)
    pair_files: list[PairFile] = field(default_factory=list)
    gold_supervised: bool | None = None
    notes: list[str] = field(default_factory=list)


def _first_line(path: Path) -> bytes:
    with path.open("rb") as handle:
        for raw in handle:
            if raw.strip():
                return raw
    raise EmptySourceError(path, "no lines: nothing to export (was the server given --trajectory-log and did any "
                                 "episode finish grading?)")


def _eval_source(path: Path) -> Source:
    try:
        results = json.loads((path / "results.json").read_text())
    except json.JSONDecodeError as exc:
        raise UnknownSourceError(path / "results.json", f"not JSON ({exc.msg}): not an eval output") from None
    policies = (results.get("policies") if isinstance(results, dict) else None) or {}
    oracle = [role for role, spec in policies.items() if str(spec).startswith("scripted:")]
    source = Source(path, "eval", episode_files=[path / "trajectories.jsonl"],
                    gold_supervised=bool(oracle) if policies else None)
    if policies:
        source.notes.append("policies: " + ", ".join(f"{role} `{spec}`" for role, spec in policies.items())
                            + (f" (scripted policies read the reference solution: {', '.join(oracle)})" if oracle else ""))
    return source


def _runs_source(path: Path, kind: SourceKind, runs: list[Path]) -> Source:
    source = Source(path, kind)
    for run in runs:
        label = str(run.relative_to(path)) if kind == "ablate" else str(path)
        if kind == "ablate" and not (run / "config.yaml").exists():
            source.notes.append(f"`{label}`: no config.yaml (the SFT control trains on gold debates and keeps no pairs): skipped")
            continue
        files = run_pair_files(run, label)
        if not files:
            source.notes.append(f"`{label}`: no replay pairs (trace replay off, or no pair emitted)")
        source.pair_files += files
    flags = [f.run_gold_supervised for f in source.pair_files]
    source.gold_supervised = any(flags) if flags and None not in flags else None
    return source


def detect_source(path: str | Path) -> Source:
    """Tell the layout of ``path`` and list its files (see the module docstring).

    Raises:
        UnknownSourceError: ``path`` does not exist or is none of the layouts.
        EmptySourceError: a JSONL file with no line.
    """
    path = Path(path)
    if path.is_file():
        if looks_like_pairs(_first_line(path)):
            return Source(path, "pairs", pair_files=[PairFile(path)])
        return Source(path, "trajectory_log", episode_files=[path])
    if not path.is_dir():
        raise UnknownSourceError(path, "no such file or directory")
    if (path / "results.json").is_file() and (path / "trajectories.jsonl").is_file():
        return _eval_source(path)
    if (path / "config.yaml").is_file():
        return _runs_source(path, "run", [path])
    runs = sorted(p for p in path.glob("runs/*/seed*") if p.is_dir())
    if runs:
        return _runs_source(path, "ablate", runs)
    raise UnknownSourceError(path, "not a layout export reads: expected a trajectory JSONL file, an eval output "
                                   "(results.json + trajectories.jsonl), a training run (config.yaml) or an ablation "
                                   "(runs/<arm>/seed<k>/)")
