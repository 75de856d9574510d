"""Random episode ids: format, uniqueness across the buffer's refills, and the bad argument."""

from __future__ import annotations

import re

import pytest

from env_server.service.ids import RandomIds


def test_ids_are_32_hex_characters_and_unique_across_refills() -> None:
    ids = RandomIds(chunk_ids=3)  # a refill every 3 ids
    drawn = [ids.next() for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in drawn)
    assert len(set(drawn)) == len(drawn)


def test_two_generators_do_not_share_ids() -> None:
    a, b = RandomIds(), RandomIds()
    assert {a.next() for _ in range(300)}.isdisjoint({b.next() for _ in range(300)})


def test_a_chunk_below_one_id_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk_ids"):
        RandomIds(chunk_ids=0)
