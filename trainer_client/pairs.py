"""DPO pairs from trace replay, and their append-only JSONL store."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["DpoPair", "PairStore"]


class DpoPair(BaseModel):
    """One preference pair for a replayed step.

    Attributes:
        prompt_messages: the exact ``state(t)`` chat the student's role saw.
        chosen: the response of a teacher in the agreeing majority.
        rejected: the student's response at step ``t``.
        episode_id, t, role: where the pair comes from.
        teacher: the name of the teacher whose response is ``chosen``.
        created_step: the training step whose rollouts were replayed.
        ref_chosen_logp, ref_rejected_logp: summed log-probs of the responses under the
            reference policy (the policy when the pair arrived), set by the trainer before the
            pair is stored.
    """

    model_config = ConfigDict(extra="forbid")
    prompt_messages: list[dict[str, str]]
    chosen: str
    rejected: str
    episode_id: str
    t: int
    role: str
    teacher: str
    created_step: int
    ref_chosen_logp: float | None = None
    ref_rejected_logp: float | None = None


class PairStore:
    """Pairs in a JSONL file (one pair per line), also kept in memory for sampling.

    Args:
        path: the file; existing pairs are loaded (a truncated last line, from a crash, is
            skipped).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pairs: list[DpoPair] = []
        self._lock = threading.Lock()
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self._pairs.append(DpoPair.model_validate_json(line))
                except (ValidationError, json.JSONDecodeError, ValueError):
                    continue  # a partially written line

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, pairs: Iterable[DpoPair]) -> None:
        """Append pairs (to the file and the in-memory list)."""
        pairs = list(pairs)
        if not pairs:
            return
        with self._lock, self.path.open("a") as handle:
            for pair in pairs:
                handle.write(pair.model_dump_json() + "\n")
            self._pairs.extend(pairs)

    def sample(self, n: int, rng: random.Random) -> list[DpoPair]:
        """Up to ``n`` distinct pairs that have reference log-probs, uniformly at random."""
        ready = [p for p in self._pairs if p.ref_chosen_logp is not None and p.ref_rejected_logp is not None]
        return rng.sample(ready, min(n, len(ready)))
