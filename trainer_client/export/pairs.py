"""The pairs dataset: trace replay's DPO pairs (:mod:`trainer_client.losses.pair_store`) as TRL's
conversational preference format, ``prompt`` (the ``state(t)`` role chat the student answered)
with ``chosen`` (a teacher of the agreeing majority) and ``rejected`` (the student's turn), each
one ``assistant`` message.

A training run keeps its pairs in ``replay.pairs_path`` of its ``config.yaml``, by default
``<output_dir>/replay_pairs.jsonl``; processes of a multi-process run each keep their own file,
``replay_pairs.rank<k>.jsonl`` (``trainer_client.training.train.rank_path``). The pairs' token
ids (the policy's own tokens) are tokenizer-specific and not exported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from datasets import Features, Value
from pydantic import ValidationError

from env_server.jsonio import JSONLineError, read_jsonl
from trainer_client.config import TrainConfig
from trainer_client.export.errors import MalformedLineError, UnknownSourceError
from trainer_client.export.sft import MESSAGES
from trainer_client.losses.pair_store import DpoPair

__all__ = ["PAIR_FEATURES", "PairFile", "looks_like_pairs", "read_pairs", "run_pair_files"]

#: The pair rows' columns (TRL's ``DPOTrainer`` reads ``prompt``, ``chosen``, ``rejected``).
PAIR_FEATURES = Features({
    "prompt": MESSAGES,
    "chosen": MESSAGES,
    "rejected": MESSAGES,
    "episode_id": Value("string"),
    "t": Value("int32"),
    "role": Value("string"),
    "teacher": Value("string"),
    "created_step": Value("int32"),
    "gold_supervised": Value("bool"),
    "run": Value("string"),
    "run_gold_supervised": Value("bool"),
    "source": Value("string"),
})


@dataclass(frozen=True)
class PairFile:
    """A pair store file and the run that wrote it.

    Attributes:
        path: the JSONL file.
        run: the run directory as the user named it (``runs/<arm>/seed<k>`` in an ablation), or
            ``None`` for a file given alone.
        run_gold_supervised: the run's ``TrainConfig.gold_supervised`` (trace replay with an
            oracle teacher), ``None`` when the run's config is unknown.
    """

    path: Path
    run: str | None = None
    run_gold_supervised: bool | None = None


def run_pair_files(run_dir: Path, label: str) -> list[PairFile]:
    """The pair files a training run wrote (none when trace replay was off or emitted no pair).

    Args:
        run_dir: the run's ``output_dir`` (holds ``config.yaml``).
        label: how the run is named in the ``run`` column.

    Raises:
        UnknownSourceError: ``config.yaml`` is missing or is not a valid training config.
    """
    config_path = run_dir / "config.yaml"
    try:
        config = TrainConfig.model_validate(yaml.safe_load(config_path.read_text()))
    except FileNotFoundError:
        raise UnknownSourceError(run_dir, "no config.yaml: not a training run directory") from None
    except (yaml.YAMLError, ValidationError, ValueError) as exc:
        raise UnknownSourceError(config_path, f"not a valid training config ({str(exc).splitlines()[0]})") from None
    if config.replay.beta <= 0:
        return []
    main = Path(config.replay.pairs_path) if config.replay.pairs_path else run_dir / "replay_pairs.jsonl"
    files = [main] if main.exists() else []
    files += sorted(main.parent.glob(f"{main.stem}.rank*{main.suffix}"))
    return [PairFile(path, label, config.gold_supervised) for path in files]


def read_pairs(pair_file: PairFile) -> list[dict[str, Any]]:
    """The rows of one pair file (the keys of :data:`PAIR_FEATURES`).

    Raises:
        MalformedLineError: a line is not a valid pair (its 1-based number and why).
        OSError: the file cannot be read.
    """
    rows = []

    def torn(error: JSONLineError) -> None:
        raise MalformedLineError(pair_file.path, error.line, f"not a replay pair: {error.reason}")

    for n, value in read_jsonl(pair_file.path, on_bad_line=torn):
        try:
            pair = DpoPair.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            raise MalformedLineError(pair_file.path, n, f"not a replay pair: {where}: {first['msg']}") from None
        rows.append({
            "prompt": pair.prompt_messages,
            "chosen": [{"role": "assistant", "content": pair.chosen}],
            "rejected": [{"role": "assistant", "content": pair.rejected}],
            "episode_id": pair.episode_id, "t": pair.t, "role": pair.role.value, "teacher": pair.teacher,
            "created_step": pair.created_step, "gold_supervised": pair.gold_supervised, "run": pair_file.run,
            "run_gold_supervised": pair_file.run_gold_supervised, "source": str(pair_file.path),
        })
    return rows


def looks_like_pairs(first_line: bytes) -> bool:
    """Whether a JSONL file's first line is a replay pair (rather than an episode line)."""
    try:
        data = json.loads(first_line)
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and {"prompt_messages", "chosen", "rejected"} <= data.keys()
