"""The runs of an ablation, kept so that an experiment can span several sittings.

Each finished run (arm × seed, or a trained control) leaves ``result.json`` in its folder:
its :class:`RunResult` and the hash of the protocol that made it (:func:`run_protocol_hash`:
the run's resolved training config, less where it writes and which server it talks to, the
starting model's identity and the evaluation settings). Given the same command again,
``mathdebate ablate`` reuses a run whose hash matches (:func:`load_run`) and refuses, in one
line, a folder a different protocol wrote (:class:`ProtocolMismatch`); a folder without
``result.json`` (a run cut short) is trained again from scratch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_server.jsonio import write_json_atomic

__all__ = ["RESULT_FILE", "ProtocolMismatch", "RunResult", "clear_unfinished", "load_run", "model_identity",
           "run_protocol_hash", "save_run"]

#: The file a finished run leaves in its folder.
RESULT_FILE = "result.json"


@dataclass
class RunResult:
    """One (arm, seed) run: its training figures and its held-out result."""

    arm: str
    seed: int
    rl_seconds: float
    steps: int
    gold_supervised: bool
    curve: list[dict[str, float]]
    means: dict[str, float]
    pairs_stored: float
    heldout: dict[str, Any]
    correct: list[bool] = field(repr=False, default_factory=list)
    #: the episode mode it trained and was evaluated in (its gain is against the starting
    #: policy evaluated in the same mode)
    mode: str = "debate"
    #: trace replay's teachers and pairs (:func:`~trainer_client.ablation.run_figures.replay_figures`;
    #: empty without replay)
    replay: dict[str, Any] = field(default_factory=dict)
    #: ``{metric: (N,) floats}`` per problem (:data:`~trainer_client.evaluation.policy_eval.ACCURACY_METRICS`;
    #: empty in results saved before these were measured)
    per_problem: dict[str, list[float]] = field(default_factory=dict)
    #: taken from an earlier sitting's ``result.json`` instead of trained now
    reused: bool = False


class ProtocolMismatch(ValueError):
    """A run folder holds a run of another protocol (the one-line refusal of a resumed ablation)."""


def model_identity(path: str | Path) -> str:
    """What identifies a starting model: an offline tiny model's spec hash (its
    ``tiny_model.json``), else the model id or path as given."""
    marker = Path(path) / "tiny_model.json"
    if marker.exists():
        return "tiny:" + str(json.loads(marker.read_text()).get("hash"))
    return str(path)


def run_protocol_hash(settings: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of ``settings`` as sorted JSON (the caller passes what
    defines the run: its config without ``output_dir``/``env_url``, the model's identity, the
    evaluation problems and settings)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_run(run_dir: Path, result: RunResult, protocol_hash: str, protocol: dict[str, Any]) -> None:
    """Write ``result.json`` (the result, its protocol and hash) atomically: a run counts as
    finished only once the whole file is there."""
    data = {"hash": protocol_hash, "protocol": protocol, "result": dataclasses.asdict(result) | {"reused": False}}
    write_json_atomic(run_dir / RESULT_FILE, data, default=str)


def load_run(run_dir: Path, protocol_hash: str) -> RunResult | None:
    """The finished run in ``run_dir`` when its protocol hash is ``protocol_hash`` (marked
    ``reused``), ``None`` when the folder holds no finished run.

    Raises:
        ProtocolMismatch: the folder's run was made by another protocol.
    """
    path = run_dir / RESULT_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("hash") != protocol_hash:
        raise ProtocolMismatch(
            f"{run_dir} holds a run of another protocol (hash {data.get('hash')}, this command's {protocol_hash}): "
            "give the same command and settings to resume it, or another --output-dir")
    return RunResult(**(data["result"] | {"reused": True}))


def clear_unfinished(run_dir: Path) -> None:
    """Remove a run folder without ``result.json`` (a run cut short), so that it trains anew
    instead of appending to a half-written ``metrics.jsonl`` or pair store."""
    if run_dir.exists() and not (run_dir / RESULT_FILE).exists():
        shutil.rmtree(run_dir)
