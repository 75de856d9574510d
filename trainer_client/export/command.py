"""``mathdebate export SOURCE... --output-dir DIR [--format disk|parquet] [--problems SPEC]``:
debates out as Hugging Face ``datasets`` (:func:`export_datasets`), with a dataset card.

Writes, for each dataset that has rows, ``DIR/<name>/`` (``Dataset.save_to_disk``) or
``DIR/<name>.parquet``, ``DIR/provenance.json`` (this export's provenance, with what each
source says made it under ``sources``) and ``DIR/README.md``: ``sft`` (:mod:`~trainer_client.export.sft`),
``pairs`` (:mod:`~trainer_client.export.pairs`), ``episodes``
(:mod:`~trainer_client.export.episodes`). Sources: :mod:`~trainer_client.export.sources`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from env_server.provenance import provenance, write_provenance

__all__ = ["DATASET_NAMES", "ExportReport", "add_export_command", "cmd_export", "export_datasets"]

#: The datasets an export may write, in this order.
DATASET_NAMES = ("sft", "pairs", "episodes")


@dataclass
class ExportReport:
    """What an export wrote.

    Attributes:
        output_dir: the directory.
        rows: rows per written dataset (datasets without rows are not written).
        sources: per source, what was read (:class:`~trainer_client.export.card.SourceReport`).
        seconds: wall-clock time of the export.
    """

    output_dir: Path
    rows: dict[str, int]
    sources: list[Any]
    seconds: float


def _read_episodes(report: Any, lookup: Any, rows: dict[str, list[dict[str, Any]]]) -> None:
    from trainer_client.export.episodes import episode_row
    from trainer_client.export.errors import MissingProblemError
    from trainer_client.export.lines import read_episode_lines
    from trainer_client.export.sft import sft_rows

    for path in report.source.episode_files:
        found = read_episode_lines(path)
        left_out = [f"{found.ungraded} ungraded (rewards null)"] * bool(found.ungraded)
        left_out += [f"{found.repeated} repeated episode ids (last line kept)"] * bool(found.repeated)
        report.files.append(f"`{path.name}`: {found.lines} lines, {len(found.episodes)} graded episodes"
                            + "".join(f", {x}" for x in left_out))
        for episode in found.episodes:
            problem = None if episode.problem is not None and episode.gold is not None else lookup.get(episode.problem_id)
            text = episode.problem if episode.problem is not None else (problem.problem if problem else None)
            gold = episode.gold if episode.gold is not None else (problem.answer if problem else None)
            if text is None:
                raise MissingProblemError(path, episode.line, episode.problem_id)
            new_sft = sft_rows(episode, text, str(path))
            rows["sft"] += new_sft
            rows["episodes"].append(episode_row(episode, text, gold, str(path)))
            report.rows["sft"] = report.rows.get("sft", 0) + len(new_sft)
            report.rows["episodes"] = report.rows.get("episodes", 0) + 1


def _source_provenance(path: Path) -> dict[str, Any] | None:
    """What a source says made it: a training run's ``provenance.json``, the ``provenance`` of an
    eval output's ``results.json`` or an ablation's ``summary.json``; ``None`` for a source that
    does not say (a server's trajectory log, a pair file)."""
    if (path / "provenance.json").is_file():
        return cast("dict[str, Any]", json.loads((path / "provenance.json").read_text()))
    for name in ("results.json", "summary.json"):
        if (path / name).is_file():
            data = json.loads((path / name).read_text())
            return cast("dict[str, Any] | None", data.get("provenance") if isinstance(data, dict) else None)
    return None


def export_datasets(sources: Sequence[str | Path], output_dir: str | Path, fmt: str = "disk",
                    problems: str | None = None) -> ExportReport:
    """Read ``sources`` and write the datasets and the card into ``output_dir``.

    Args:
        sources: trajectory logs, eval outputs, training runs, ablations, pair files (any mix).
        output_dir: created; must be empty or absent.
        fmt: ``"disk"`` (``save_to_disk``) or ``"parquet"``.
        problems: the server's ``--problems`` spec, for statements a trajectory log lacks.

    Returns:
        An :class:`ExportReport`.

    Raises:
        ExportError: ``UnknownSourceError``, ``EmptySourceError`` (a source, or all together,
            with nothing to export), ``MalformedLineError`` (file and line number),
            ``MissingProblemError``; also a non-empty ``output_dir`` or an unknown ``fmt``.
        OSError: a file cannot be read or written.
    """
    from datasets import Dataset

    from trainer_client.export.card import SourceReport, dataset_card
    from trainer_client.export.episodes import EPISODE_FEATURES
    from trainer_client.export.errors import EmptySourceError, ExportError
    from trainer_client.export.pairs import PAIR_FEATURES, read_pairs
    from trainer_client.export.problems import ProblemLookup
    from trainer_client.export.sft import SFT_FEATURES
    from trainer_client.export.sources import detect_source

    start = time.perf_counter()
    if fmt not in ("disk", "parquet"):
        raise ExportError(f"unknown format {fmt!r}: choose disk or parquet")
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: the output directory must be empty or absent")
    if not sources:
        raise ExportError("no source given")
    try:
        lookup = ProblemLookup(problems)
    except (FileNotFoundError, ValueError) as exc:
        raise ExportError(f"--problems {problems!r}: {exc}") from None
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in DATASET_NAMES}
    reports = []
    for given in sources:
        report = SourceReport(detect_source(given))
        _read_episodes(report, lookup, rows)
        for pair_file in report.source.pair_files:
            pairs = read_pairs(pair_file)
            report.files.append(f"`{pair_file.path}`: {len(pairs)} pairs")
            rows["pairs"] += pairs
            report.rows["pairs"] = report.rows.get("pairs", 0) + len(pairs)
        reports.append(report)
    written = {name: r for name, r in rows.items() if r}
    if not written:
        raise EmptySourceError(Path(sources[0]), "no episode and no replay pair in the given sources")
    features = {"sft": SFT_FEATURES, "pairs": PAIR_FEATURES, "episodes": EPISODE_FEATURES}
    out.mkdir(parents=True, exist_ok=True)
    for name, name_rows in written.items():
        dataset = Dataset.from_list(name_rows, features=features[name])
        if fmt == "parquet":
            dataset.to_parquet(str(out / f"{name}.parquet"))
        else:
            dataset.save_to_disk(str(out / name))
    created = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (out / "README.md").write_text(dataset_card(reports, written, fmt, created))
    write_provenance(out, {**provenance({"sources": [str(s) for s in sources], "format": fmt, "problems": problems}),
                           "sources": {str(r.source.path): _source_provenance(Path(r.source.path)) for r in reports}})
    return ExportReport(out, {name: len(r) for name, r in written.items()}, reports, time.perf_counter() - start)


def cmd_export(args: argparse.Namespace) -> int:
    """``mathdebate export``: 0 on success; bad input (``ExportError``, a file that cannot be read) is a
    ``UsageError``: the reason on one line, exit 2."""
    from env_server.usage import reading

    with reading("cannot export", "pass trajectory files, eval outputs, training runs, ablations or pair stores"):
        report = export_datasets(args.sources, args.output_dir, args.format, args.problems)
    counts = ", ".join(f"{name} {n} rows" for name, n in report.rows.items())
    print(f"mathdebate export: {counts} in {report.seconds:.1f} s -> {report.output_dir} (card: README.md)")
    return 0


def add_export_command(sub: Any) -> None:
    """Add ``export`` to the ``mathdebate`` subcommands (``sub``: argparse's subparsers action)."""
    export = sub.add_parser("export", help="debates out as Hugging Face datasets: SFT chats, DPO pairs, episodes")
    export.add_argument("sources", nargs="+", metavar="SOURCE",
                        help="a trajectory log (serve --trajectory-log), an eval output dir, a training run dir, "
                             "an ablate output dir or a replay_pairs.jsonl")
    export.add_argument("--output-dir", required=True, help="where the datasets and README.md go (empty or absent)")
    export.add_argument("--format", choices=["disk", "parquet"], default="disk",
                        help="disk: Dataset.save_to_disk folders; parquet: one <name>.parquet per dataset")
    export.add_argument("--problems", default=None,
                        help="the server's --problems, for statements a trajectory log lacks (gen/ ids need none)")
    export.set_defaults(func=cmd_export)
