"""The dataset card (``README.md`` of an export): where the data came from, whether it is
gold-supervised, what each dataset's rows are and how to load them. Front matter in the Hugging
Face card format; with ``--format parquet`` it names each dataset as a config (the Hub's way to
list them once the folder is uploaded). Locally the card says to load a file by its path
(``load_dataset("parquet", data_files=...)``): ``load_dataset(DIR, "sft")`` keys its cache on the
folder and the config, and with datasets 5.2 it returned the rows of an earlier export into a
folder of the same name (measured here; the cache of a local file is keyed on its mtime)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from trainer_client.export.sources import Source

__all__ = ["DATASET_NOTES", "SourceReport", "dataset_card", "gold_statement"]

#: What one row of each dataset is.
DATASET_NOTES = {
    "sft": "one row per role turn: `messages` is the chat that role saw before the turn (the server's role chat, "
           "as in each observation's `messages`) followed by the turn as the `assistant` message; `reward`, `correct` "
           "and the error-site marker (`error_kind`, `hint_template_key`, the localised `hint` where the family has one) "
           "are the turn's own, so "
           "`ds.filter(lambda r: r['reward'] == 1)` keeps the turns graded right. In a revision chat the earlier "
           "`assistant` messages are the role's own earlier turns (each also a row). For TRL's `SFTTrainer`.",
    "pairs": "one row per trace-replay DPO pair: `prompt` is the `state(t)` role chat the student answered, `chosen` "
             "the response of a teacher in the agreeing majority, `rejected` the student's turn, each one `assistant` "
             "message (TRL's conversational preference format, for `DPOTrainer`). `gold_supervised`: an oracle teacher "
             "(reference solutions) is in the majority; `run_gold_supervised`: the run's config has an oracle teacher.",
    "episodes": "one row per graded episode: the episode reward, the counterfactual facts of the rewards record "
                "(RFC 0003), per-role local rewards and rewards without each role, `turns` (content, reward, answer, "
                "correctness and error-site marker of each turn), the distinct `error_kinds` and the number of "
                "`error_sites`.",
}


@dataclass
class SourceReport:
    """What was read from one source, for the card and the command's summary.

    Attributes:
        source: the detected source.
        files: per file read, a short account (``"trajectories.jsonl: 40 lines, 2 ungraded"``).
        rows: rows it gave each dataset.
    """

    source: Source
    files: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)


def gold_statement(name: str, rows: Sequence[dict[str, Any]]) -> str:
    """One line on the gold supervision of a dataset, counted over its rows' ``gold_supervised``
    (and, for pairs, the runs labelled gold-supervised)."""
    flags = [row["gold_supervised"] for row in rows]
    yes, unknown = sum(f is True for f in flags), sum(f is None for f in flags)
    if unknown == len(rows):
        parts = [f"**{name}**: gold supervision unknown for all {len(rows)} rows"]
    else:
        parts = [f"**{name}**: {yes} of {len(rows) - unknown} rows gold-supervised"
                 + (f" ({unknown} more unknown)" if unknown else "")]
    if name == "pairs":
        runs = sorted({row["run"] for row in rows if row["run_gold_supervised"]})
        if runs:
            parts.append("from runs labelled gold-supervised (oracle teachers): " + ", ".join(f"`{r}`" for r in runs))
    elif yes:
        parts.append("their turns were written by scripted policies that read the reference solution")
    if unknown:
        parts.append("a server trajectory log does not record who played a turn (`mathdebate play`'s scripted "
                     "debaters read the reference solution; a trained policy does not)")
    return "; ".join(parts) + "."


def dataset_card(reports: Sequence[SourceReport], datasets: dict[str, list[dict[str, Any]]], fmt: str,
                 created: str) -> str:
    """The card's text.

    Args:
        reports: one per source, in the order given.
        datasets: each written dataset's rows (only non-empty ones are written).
        fmt: ``disk`` (``save_to_disk`` folders) or ``parquet`` (one ``<name>.parquet`` each).
        created: when the export ran (shown as given).
    """
    front: dict[str, Any] = {"tags": ["mathdebate", "math", "debate"]}
    if fmt == "parquet":
        front["configs"] = [{"config_name": name, "data_files": f"{name}.parquet"} for name in datasets]
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "", "# mathdebate export", "",
             f"Written by `mathdebate export` on {created}, format `{fmt}`.", "", "## Sources", ""]
    for report in reports:
        src = report.source
        counts = ", ".join(f"{n} {name} rows" for name, n in report.rows.items() if n) or "no rows"
        lines.append(f"- `{src.path}` ({src.kind.replace('_', ' ')}): {counts}")
        lines += [f"  - {entry}" for entry in (*report.files, *src.notes)]
    lines += ["", "## Gold supervision", "",
              "Gold-supervised data has targets taken from reference solutions (oracle teachers of trace replay, "
              "scripted policies, the SFT control); do not report it as learning from rewards alone.", ""]
    lines += [f"- {gold_statement(name, rows)}" for name, rows in datasets.items()]
    lines += ["", "## Datasets", ""]
    for name, rows in datasets.items():
        load = (f"datasets.load_dataset('parquet', data_files='DIR/{name}.parquet', split='train')" if fmt == "parquet"
                else f"datasets.load_from_disk('DIR/{name}')")
        lines += [f"### {name} ({len(rows)} rows)", "", DATASET_NOTES[name], "", f"Load (DIR: this folder): `{load}`", ""]
    return "\n".join(lines)
