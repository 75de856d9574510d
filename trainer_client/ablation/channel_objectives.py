"""Whether each loss channel learned its own objective in a run, read off its ``metrics.jsonl``
(issue 56: "a mechanism counts when its own objective is learned, not only when its weight is
non-zero").

- Trace replay: the last monitor's ``replay/heldout/margin_above_start`` (share of held-out
  pairs whose margin ``log π(chosen) − log π(rejected)`` is above the frozen start's) and how
  many pairs it read, the last ``replay/heldout/accuracy``, DPO's term
  (``loss/trace_replay_dpo``) over the first and the last ``window`` training steps, pairs stored
  and group pairs added.
- Hint distillation: ``loss/sdpo_jsd`` and ``sdpo/teacher_advantage`` (teacher minus student
  log-prob of the right token on the distilled sites, nats) over the first and last ``window``
  steps and over the run.
- Every run: ``tokens/sampled`` summed over its steps (the compute a comparison equalises).

Means are over the steps that logged the key, each step weighing one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["channel_objectives", "read_curve"]


def read_curve(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of a run's ``metrics.jsonl`` (blank lines skipped).

    Raises:
        FileNotFoundError: no such file.
        json.JSONDecodeError: a line is not JSON.
    """
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _windows(curve: list[dict[str, Any]], key: str, window: int) -> dict[str, float | None]:
    values = [float(line[key]) for line in curve if key in line and "eval/problems" not in line]
    return {"first": _mean(values[:window]), "last": _mean(values[-window:]), "run": _mean(values)}


def _last(curve: list[dict[str, Any]], key: str) -> float | None:
    values = [float(line[key]) for line in curve if key in line]
    return values[-1] if values else None


def channel_objectives(curve: list[dict[str, Any]], window: int = 20) -> dict[str, Any]:
    """The channels' own objectives in one run's logged metrics.

    Args:
        curve: the run's ``metrics.jsonl`` lines in order (training steps and ``eval/`` lines).
        window: steps in the "first" and "last" means.

    Returns:
        ``{"tokens_sampled": float, "replay": {...} | None, "sdpo": {...} | None}``: ``replay`` is
        ``None`` when no step logged ``pairs/stored``, else ``margin_above_start``,
        ``heldout_pairs``, ``heldout_accuracy`` (last monitor; ``None`` if none ran),
        ``dpo_loss`` (``{"first", "last", "run"}`` means), ``pairs_stored`` (last),
        ``group_pairs`` (sum); ``sdpo`` is ``None`` when no step logged ``loss/sdpo_jsd``, else
        ``jsd`` and ``teacher_advantage`` as ``{"first", "last", "run"}`` means.

    Raises:
        ValueError: ``window`` below 1.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    out: dict[str, Any] = {"tokens_sampled": sum(float(line.get("tokens/sampled", 0.0)) for line in curve),
                           "replay": None, "sdpo": None}
    if any("pairs/stored" in line for line in curve):
        out["replay"] = {"margin_above_start": _last(curve, "replay/heldout/margin_above_start"),
                         "heldout_pairs": _last(curve, "replay/heldout/pairs"),
                         "heldout_accuracy": _last(curve, "replay/heldout/accuracy"),
                         "dpo_loss": _windows(curve, "loss/trace_replay_dpo", window),
                         "pairs_stored": _last(curve, "pairs/stored"),
                         "group_pairs": sum(float(line.get("replay/group_pairs", 0.0)) for line in curve)}
    if any("sdpo/sites" in line for line in curve):  # loss/sdpo_jsd is logged (as 0) with the channel off too
        out["sdpo"] = {"jsd": _windows(curve, "loss/sdpo_jsd", window),
                       "teacher_advantage": _windows(curve, "sdpo/teacher_advantage", window)}
    return out
