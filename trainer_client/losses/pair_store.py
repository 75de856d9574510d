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

A pair comes from the teachers (``source: "teachers"``: a teacher's answer against the student's
turn) or from the policy's own GRPO group (``source: "group"``: a rollout's right first turn
against a wrong one on the same prompt, :meth:`TraceReplayDPO.store_group_pairs
<trainer_client.losses.trace_replay.TraceReplayDPO.store_group_pairs>`). With
``replay.draws_per_pair`` the store counts how often each pair was drawn for training
(:meth:`PairStore.sample`'s ``max_draws``) and keeps the counts in its :meth:`PairStore.state_dict`.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from env_server.jsonio import read_jsonl
from env_server.protocol.markers import Role

__all__ = ["DpoPair", "PairStore", "is_heldout_pair"]

log = logging.getLogger(__name__)


class DpoPair(BaseModel):
    """One preference pair for a replayed step.

    Attributes:
        prompt_messages: the ``state(t)`` chat the student's role saw on the server (what the
            teachers answered; for humans); empty for group pairs (their context is
            ``context_ids`` alone).
        chosen: the text of a teacher in the agreeing majority (for humans); for a group pair
            the right rollout's turn, decoded from ``chosen_ids``.
        rejected: the student's turn content as the server's transcript has it (for humans);
            for a group pair the wrong rollout's turn, decoded from ``rejected_ids``.
        episode_id, t, role: where the pair comes from (a group pair: the wrong rollout's episode).
        teacher: the name of the teacher whose response is ``chosen``; for a group pair
            ``"group:<episode id of the right rollout>"``.
        created_step: the training step whose rollouts were replayed.
        context_ids: the rollout's prompt + completion token ids before the assistant message
            that produced turn ``t`` (ends with the template's generation prompt).
        rejected_ids: the tokens the policy generated for that message, exactly as generated.
        chosen_ids: the teacher's response as an assistant message calling the role's tool,
            rendered by the policy's chat template as the delta after the generation prompt
            (ending, like a generated message, with the end-of-turn token). Set by the trainer.
            For a group pair: the right rollout's tokens of the turn, exactly as sampled.
        gold_supervised: an oracle teacher (reference solutions) is in the agreeing majority.
        ref_chosen_logp, ref_rejected_logp: summed log-probs of ``chosen_ids`` and
            ``rejected_ids`` given ``context_ids`` under the reference policy (the student's
            initial policy, or with ``replay.ref_model_sync_steps`` the reference as it stood
            after ``ref_sync`` syncs), set by the trainer before the pair is stored.
        ref_chosen_token_logps, ref_rejected_token_logps: the same per token of the capped
            sides (``replay.pair_tokens: disagreement``, whose margin weighs tokens apart);
            ``None`` for pairs stored without them.
        ref_sync: how many reference syncs (``replay.ref_model_sync_steps``) the reference had
            had when the ``ref_*`` values were computed; 0: the initial policy. The file keeps
            the value at storage; the trainer recomputes the references of a drawn pair whose
            ``ref_sync`` is not the current count (in memory only).
        source: ``"teachers"`` (a teacher's answer against the student's turn) or ``"group"``
            (the policy's right turn against its wrong turn on the same prompt, one GRPO group).
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
    ref_sync: int = 0
    source: Literal["teachers", "group"] = "teachers"
    #: the pair's summed log-probs under the frozen start policy, once known (not stored)
    _start_logps: tuple[float, float] | None = PrivateAttr(default=None)

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
        #: (:func:`pair_hash`), computed once as pairs come in, not at every step's draw, and
        #: their index in the file's order (:attr:`_pairs`)
        self._ready_pairs: list[tuple[DpoPair, int, int]] = []
        #: how often each pair (by its index in the file's order) was drawn with ``max_draws``
        self._draws: dict[int, int] = {}
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
            self._ready_pairs = _ready_with_hash(self._pairs, 0)

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
            start = len(self._pairs)
            self._pairs.extend(pairs)
            self._ready_pairs.extend(_ready_with_hash(pairs, start))
            self._warn_untokenized(pairs)

    def sample(self, n: int, rng: random.Random, *, min_step: int | None = None,
               heldout_share: float = 0.0, max_draws: int | None = None) -> list[DpoPair]:
        """Up to ``n`` distinct trainable pairs (token ids and reference log-probs) among those
        created at ``min_step`` or later (``None``: all) and not held out
        (:func:`is_heldout_pair` with ``heldout_share``).

        Args:
            n: how many pairs at most.
            rng: the run's seeded stream (the draw is reproducible from its state).
            min_step, heldout_share: see above.
            max_draws: ``None``: uniformly at random (``rng.sample``). Otherwise each pair is
                returned at most ``max_draws`` times over the store's life
                (``replay.draws_per_pair``): the ``n`` pairs drawn fewest times so far, ties
                broken by ``rng`` (the candidates are shuffled by ``rng``, then sorted stably
                by their draw count); a pair that reached ``max_draws`` is retired. The
                returned pairs' counts go up by one (kept in :meth:`state_dict`).

        Raises:
            ValueError: ``max_draws`` below 1.
        """
        limit = share_limit(heldout_share)
        ready = [(p, i) for p, h, i in self._ready() if (min_step is None or p.created_step >= min_step) and h >= limit]
        if max_draws is None:
            return [p for p, _ in rng.sample(ready, min(n, len(ready)))]
        if max_draws < 1:
            raise ValueError(f"max_draws must be at least 1, got {max_draws}")
        with self._lock:
            live = [(p, i) for p, i in ready if self._draws.get(i, 0) < max_draws]
            rng.shuffle(live)
            live.sort(key=lambda item: self._draws.get(item[1], 0))  # stable: the shuffle breaks ties
            chosen = live[:n]
            for _, i in chosen:
                self._draws[i] = self._draws.get(i, 0) + 1
        return [p for p, _ in chosen]

    def draw_counts(self) -> dict[int, int]:
        """How often each pair was drawn with ``max_draws``: ``{index in the file's order: count}``
        (pairs never drawn left out)."""
        with self._lock:
            return dict(self._draws)

    def heldout(self, n: int, heldout_share: float) -> list[DpoPair]:
        """The ``n`` most recent held-out pairs (:func:`is_heldout_pair`) with token ids and
        reference log-probs: pairs never trained on, to monitor the channel."""
        limit = share_limit(heldout_share)
        return [p for p, h, _ in self._ready() if h < limit][-n:]

    def _ready(self) -> list[tuple[DpoPair, int, int]]:
        with self._lock:
            return list(self._ready_pairs)

    def state_dict(self) -> dict[str, object]:
        """Where the store stands, for a checkpoint: ``{"path": str, "offset": bytes in the
        file, "count": pairs}`` (the file is append-only, so the offset marks every pair
        stored so far), and once pairs were drawn with ``max_draws`` their counts,
        ``"draws": [[index, count], ...]`` (:meth:`draw_counts`)."""
        with self._lock:
            offset = self.path.stat().st_size if self.path.exists() else 0
            state: dict[str, object] = {"path": str(self.path), "offset": offset, "count": len(self._pairs)}
            if self._draws:
                state["draws"] = [[i, c] for i, c in sorted(self._draws.items())]
            return state

    def load_state_dict(self, state: dict[str, object]) -> int:
        """Go back to a checkpoint's :meth:`state_dict`: the file is cut at its ``offset`` (the
        pairs stored after the checkpoint came from steps that will be trained again, and
        would otherwise be stored twice) and reloaded, and the draw counts put back (none in a
        checkpoint taken before they were kept). Returns the number of pairs dropped.

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
            draws = cast("list[list[int]]", state.get("draws") or [])  # JSON [index, count] pairs
            self._draws = {int(i): int(c) for i, c in draws}
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


def _ready_with_hash(pairs: Iterable[DpoPair], start: int) -> list[tuple[DpoPair, int, int]]:
    """The pairs that can be trained on (token ids and reference log-probs), each with its hash
    and its index in the store (``start`` + its position in ``pairs``)."""
    return [(p, pair_hash(p), start + k) for k, p in enumerate(pairs)
            if p.has_token_ids and p.ref_chosen_logp is not None and p.ref_rejected_logp is not None]
