"""DPO pairs from trace replay, and their append-only JSONL store.

A pair lives on the policy's own tokens: ``context_ids`` are the rollout's prompt and
completion token ids up to the assistant message that produced the replayed turn (exactly what
the policy conditioned on), ``rejected_ids`` the tokens the policy generated for that message,
``chosen_ids`` the teacher's response as the same role's tool call, rendered by the policy's chat
template (:mod:`trainer_client.losses.replay_pairs`). The texts are kept for humans.

Pairs written before pairs carried token ids (no ``context_ids``/``chosen_ids``/``rejected_ids``)
still load: they stay in the file, are never sampled for training (their only context is the
server's role chat, a context and a message format the policy never generated in, and the
rollout's tokens cannot be recovered from them) and the store warns once about them.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from env_server.jsonio import read_jsonl
from env_server.protocol.markers import Role

__all__ = ["DpoPair", "PairStore", "is_heldout_pair"]

log = logging.getLogger(__name__)


class DpoPair(BaseModel):
    """One preference pair for a replayed step.

    Attributes:
        prompt_messages: the ``state(t)`` chat the student's role saw on the server (what the
            teachers answered; for humans).
        chosen: the text of a teacher in the agreeing majority (for humans).
        rejected: the student's turn content as the server's transcript has it (for humans).
        episode_id, t, role: where the pair comes from.
        teacher: the name of the teacher whose response is ``chosen``.
        created_step: the training step whose rollouts were replayed.
        context_ids: the rollout's prompt + completion token ids before the assistant message
            that produced turn ``t`` (ends with the template's generation prompt).
        rejected_ids: the tokens the policy generated for that message, exactly as generated.
        chosen_ids: the teacher's response as an assistant message calling the role's tool,
            rendered by the policy's chat template as the delta after the generation prompt
            (ending, like a generated message, with the end-of-turn token). Set by the trainer.
        gold_supervised: an oracle teacher (reference solutions) is in the agreeing majority.
        ref_chosen_logp, ref_rejected_logp: summed log-probs of ``chosen_ids`` and
            ``rejected_ids`` given ``context_ids`` under the reference policy (the student's
            initial policy), set by the trainer before the pair is stored.
        ref_chosen_token_logps, ref_rejected_token_logps: the same per token of the capped
            sides (``replay.pair_tokens: disagreement``, whose margin weighs tokens apart);
            ``None`` for pairs stored without them.
    """

    model_config = ConfigDict(extra="forbid")
    prompt_messages: list[dict[str, str]]
    chosen: str
    rejected: str
    episode_id: str
    t: int
    role: Role
    teacher: str
    created_step: int
    context_ids: list[int] | None = None
    chosen_ids: list[int] | None = None
    rejected_ids: list[int] | None = None
    gold_supervised: bool = False
    ref_chosen_logp: float | None = None
    ref_rejected_logp: float | None = None
    ref_chosen_token_logps: list[float] | None = None
    ref_rejected_token_logps: list[float] | None = None

    @property
    def has_token_ids(self) -> bool:
        """Whether the pair carries its context, chosen and rejected token ids (all non-empty)."""
        return bool(self.context_ids) and bool(self.chosen_ids) and bool(self.rejected_ids)


class PairStore:
    """Pairs in a JSONL file (one pair per line), also kept in memory for sampling.

    Args:
        path: the file; existing pairs are loaded (a truncated last line, from a crash, is
            skipped; pairs without token ids are kept but never sampled, with one warning).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pairs: list[DpoPair] = []
        #: the trainable pairs (token ids and reference log-probs) with their held-out hash
        #: (:func:`pair_hash`), computed once as pairs come in, not at every step's draw
        self._ready_pairs: list[tuple[DpoPair, int]] = []
        self._lock = threading.Lock()
        self._warned_untokenized = False
        self._load()

    def _load(self) -> None:
        self._pairs = []
        self._ready_pairs = []
        if self.path.exists():
            for _, line in read_jsonl(self.path, on_bad_line=lambda error: None):  # a partially written line: skipped
                try:
                    self._pairs.append(DpoPair.model_validate(line))
                except ValidationError:
                    continue  # a line of another shape
            self._warn_untokenized(self._pairs)
            self._ready_pairs = _ready_with_hash(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def _warn_untokenized(self, pairs: list[DpoPair]) -> None:
        """One warning per store about pairs without token ids (an older format)."""
        untokenized = sum(not p.has_token_ids for p in pairs)
        if untokenized and not self._warned_untokenized:
            self._warned_untokenized = True
            log.warning("%d pair(s) in %s have no token ids (context_ids/chosen_ids/rejected_ids; written before pairs "
                        "were built on the rollout's own tokens): kept in the file, never sampled for training",
                        untokenized, self.path)

    def add(self, pairs: Iterable[DpoPair]) -> None:
        """Append pairs (to the file and the in-memory list)."""
        pairs = list(pairs)
        if not pairs:
            return
        with self._lock, self.path.open("a") as handle:
            for pair in pairs:
                handle.write(pair.model_dump_json() + "\n")
            self._pairs.extend(pairs)
            self._ready_pairs.extend(_ready_with_hash(pairs))
            self._warn_untokenized(pairs)

    def sample(self, n: int, rng: random.Random, *, min_step: int | None = None,
               heldout_share: float = 0.0) -> list[DpoPair]:
        """Up to ``n`` distinct trainable pairs (token ids and reference log-probs), uniformly at
        random, among those created at ``min_step`` or later (``None``: all) and not held out
        (:func:`is_heldout_pair` with ``heldout_share``)."""
        limit = share_limit(heldout_share)
        ready = [p for p, h in self._ready() if (min_step is None or p.created_step >= min_step) and h >= limit]
        return rng.sample(ready, min(n, len(ready)))

    def heldout(self, n: int, heldout_share: float) -> list[DpoPair]:
        """The ``n`` most recent held-out pairs (:func:`is_heldout_pair`) with token ids and
        reference log-probs: pairs never trained on, to monitor the channel."""
        limit = share_limit(heldout_share)
        return [p for p, h in self._ready() if h < limit][-n:]

    def _ready(self) -> list[tuple[DpoPair, int]]:
        with self._lock:
            return list(self._ready_pairs)

    def state_dict(self) -> dict[str, object]:
        """Where the store stands, for a checkpoint: ``{"path": str, "offset": bytes in the
        file, "count": pairs}`` (the file is append-only, so the offset marks every pair
        stored so far)."""
        with self._lock:
            offset = self.path.stat().st_size if self.path.exists() else 0
            return {"path": str(self.path), "offset": offset, "count": len(self._pairs)}

    def load_state_dict(self, state: dict[str, object]) -> int:
        """Go back to a checkpoint's :meth:`state_dict`: the file is cut at its ``offset`` (the
        pairs stored after the checkpoint came from steps that will be trained again, and
        would otherwise be stored twice) and reloaded. Returns the number of pairs dropped.

        Raises:
            ValueError: the file is shorter than the checkpoint says, or the pairs before the
                offset are not the checkpoint's ``count`` (another file, or one rewritten since).
        """
        offset, count = int(state["offset"]), int(state["count"])  # type: ignore[call-overload]  # JSON ints
        with self._lock:
            size = self.path.stat().st_size if self.path.exists() else 0
            if size < offset:
                raise ValueError(f"{self.path} holds {size} bytes, fewer than the checkpoint's {offset}: "
                                 "it is not the pair store the checkpoint was taken with")
            if size > offset:
                with self.path.open("r+b") as handle:
                    handle.truncate(offset)
            before = len(self._pairs)
            self._load()
            if len(self._pairs) != count:
                raise ValueError(f"{self.path} holds {len(self._pairs)} pairs before byte {offset}, the checkpoint "
                                 f"says {count}: it is not the pair store the checkpoint was taken with")
        return before - count


def pair_hash(pair: DpoPair) -> int:
    """The CRC-32 that decides whether ``pair`` is held out: over what the student saw and wrote
    (its turn, role, context and rejected token ids; ``"<episode_id>/<t>"`` for a pair without
    token ids). It depends on the pair's content only: the same on every process, after a
    restart and in a second run with the same seed (episode ids are drawn afresh by each run's
    server, so hashing them made two runs with the same settings hold out different pairs), and
    an identical rollout is never split across the held-out and the trained side."""
    key = (json.dumps([pair.t, pair.role.value, pair.context_ids, pair.rejected_ids]) if pair.has_token_ids
           else f"{pair.episode_id}/{pair.t}")
    return zlib.crc32(key.encode())


def share_limit(share: float) -> float:
    """The hashes below which a pair is held out for ``share`` (0: none)."""
    return share * 2**32 if share > 0 else -1.0


def is_heldout_pair(pair: DpoPair, share: float) -> bool:
    """Whether ``pair`` is kept out of training: its :func:`pair_hash` falls in the lowest
    ``share`` of its range."""
    return pair_hash(pair) < share_limit(share)


def _ready_with_hash(pairs: Iterable[DpoPair]) -> list[tuple[DpoPair, int]]:
    """The pairs that can be trained on (token ids and reference log-probs), each with its hash."""
    return [(p, pair_hash(p)) for p in pairs
            if p.has_token_ids and p.ref_chosen_logp is not None and p.ref_rejected_logp is not None]
