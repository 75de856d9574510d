"""Problem splits by seed range, and families whose splits are disjoint by content.

The learning experiments draw every problem with ``ProblemSource.by_seed(seed)`` and keep the
phases apart by seed range:

=============  ===========================================  =========================================
split          seeds                                        used by
=============  ===========================================  =========================================
``rl``         ``0 .. 10**8 - 1``                           RL training (``config.seed + i``)
``warmup``     ``WARMUP_SEED_BASE .. HELDOUT_SEED_BASE-1``   the tiny models' supervised warm-ups
``heldout``    ``HELDOUT_SEED_BASE .. + 499,999``           the reported evaluation
``validation`` ``VALIDATION_SEED_BASE ..``                  choosing settings (never reported as a
                                                            result)
=============  ===========================================  =========================================

For most families a seed range keeps only the *seeds* apart: ``single_digit_sum`` has 100
distinct problems, so every held-out problem was also a training problem. A *split family*
(:data:`SPLIT_FAMILIES`) instead assigns every problem's content to one split: its ordered
problem lists per split are disjoint (a problem and its commuted twin, ``a + b`` and
``b + a``, always fall in the same split), and the seed's range picks which list the problem
comes from (seed ``base + i`` is item ``i`` of the split's list, cycling).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from functools import lru_cache

__all__ = ["HELDOUT_SEED_BASE", "SPLITS", "SPLIT_SHARES", "VALIDATION_SEED_BASE", "WARMUP_SEED_BASE",
           "division_pairs", "split_index", "split_of_seed", "two_digit_pairs"]

#: First seed of the supervised warm-up split (below: RL training seeds).
WARMUP_SEED_BASE = 10**8
#: First seed of the held-out split: the problems results are reported on.
HELDOUT_SEED_BASE = 10**9
#: First seed of the validation split: the problems settings are chosen on.
VALIDATION_SEED_BASE = HELDOUT_SEED_BASE + 500_000

SPLITS = ("rl", "warmup", "heldout", "validation")
#: Percent of a split family's content buckets per split (sums to 100).
SPLIT_SHARES = {"warmup": 40, "rl": 30, "validation": 15, "heldout": 15}


def split_of_seed(seed: int) -> str:
    """The split a seed belongs to (see the module's table).

    Raises:
        ValueError: a negative seed.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if seed < WARMUP_SEED_BASE:
        return "rl"
    if seed < HELDOUT_SEED_BASE:
        return "warmup"
    return "heldout" if seed < VALIDATION_SEED_BASE else "validation"


def split_index(seed: int) -> int:
    """The seed's position within its split's seed range (``seed - <split base>``)."""
    base = {"rl": 0, "warmup": WARMUP_SEED_BASE, "heldout": HELDOUT_SEED_BASE,
            "validation": VALIDATION_SEED_BASE}[split_of_seed(seed)]
    return seed - base


def _bucket(key: str) -> str:
    """The split of a problem's content ``key``: SHA-256 of the key into 100 buckets, shared out
    by :data:`SPLIT_SHARES` (stable across Python versions and machines, unlike ``hash``)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    for split, share in SPLIT_SHARES.items():
        if bucket < share:
            return split
        bucket -= share
    raise AssertionError("SPLIT_SHARES sums to 100")


def _split_by_content(family: str, items: list[tuple[int, int]], key: Callable[[int, int], str]
                      ) -> dict[str, list[tuple[int, int]]]:
    """``items`` shared out over :data:`SPLITS` by ``_bucket(f"{family}:{key(*item)}")``, each split's
    list in a fixed shuffled order (seeded by ``"<family>/<split>"``)."""
    out: dict[str, list[tuple[int, int]]] = {split: [] for split in SPLITS}
    for item in items:
        out[_bucket(f"{family}:{key(*item)}")].append(item)
    for split, pairs in out.items():
        random.Random(f"{family}/{split}").shuffle(pairs)
    return out


@lru_cache(maxsize=1)
def two_digit_pairs() -> dict[str, list[tuple[int, int]]]:
    """The ordered pairs ``(a, b)`` with ``10 <= a, b <= 99`` (8,100), split by the unordered pair's
    content (``"two_digit_sum:<min>+<max>"``), each split's list in a fixed shuffled order."""
    return _split_by_content("two_digit_sum", [(a, b) for a in range(10, 100) for b in range(10, 100)],
                             lambda a, b: f"{min(a, b)}+{max(a, b)}")


@lru_cache(maxsize=1)
def division_pairs() -> dict[str, list[tuple[int, int]]]:
    """The pairs ``(quotient, divisor)`` with ``10 <= quotient <= 99`` and ``2 <= divisor <= 9``
    (720) of ``exact_division``, split by content (``"exact_division:<dividend>/<divisor>"``),
    each split's list in a fixed shuffled order. A dividend with two divisors (``84 = 12 * 7 =
    14 * 6``) gives two problems, each split on its own: they share no answer and no step."""
    return _split_by_content("exact_division", [(q, d) for q in range(10, 100) for d in range(2, 10)],
                             lambda q, d: f"{q * d}/{d}")
