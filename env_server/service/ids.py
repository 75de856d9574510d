"""Random ids for episodes."""

from __future__ import annotations

import os

__all__ = ["RandomIds"]


class RandomIds:
    """128-bit random ids (32 hex characters) from the operating system's CSPRNG
    (``os.urandom``), read ``chunk_ids`` ids at a time.

    ``os.urandom(16)`` per id is one ``getrandom`` system call per episode, a visible share of a
    loaded server's event loop (``benchmarks/README.md``); the ids are the same kind of bytes,
    read 4 KiB at a time. Not for secrets (resume tokens are made elsewhere, one call each):
    the unread ids sit in process memory.

    Args:
        chunk_ids: ids read per system call (>= 1).

    Raises:
        ValueError: ``chunk_ids < 1``.
    """

    __slots__ = ("_buffer", "_chunk", "_offset")

    def __init__(self, chunk_ids: int = 256) -> None:
        if chunk_ids < 1:
            raise ValueError(f"chunk_ids must be >= 1, got {chunk_ids}")
        self._chunk = 16 * chunk_ids
        self._buffer = b""
        self._offset = 0

    def next(self) -> str:
        """A new id: 32 lower-case hex characters."""
        if self._offset >= len(self._buffer):
            self._buffer, self._offset = os.urandom(self._chunk), 0
        start = self._offset
        self._offset = start + 16
        return self._buffer[start:start + 16].hex()
