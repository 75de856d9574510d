"""Which batch row each prompt of a generation round of TRL's tool loop belongs to (TRL passes
no row index): :class:`RowTracker`, used by role routing and by state branching."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RowTracker"]


class RowTracker:
    """Which batch rows one generation round of TRL's tool loop is for.

    trl 1.16 ``_tool_call_loop`` generates, each round, for the rows that called a tool (in
    batch order), each prompt being that row's prompt and completion so far plus the tool
    result; it passes no row index. A row's tokens so far are therefore a prefix of its next
    prompt: each prompt goes to the row after the previous match whose tokens are the longest
    prefix of it (a row that stopped earlier keeps a shorter record), the first of equals. Rows
    whose tokens are identical so far are interchangeable here (the same history gives the same
    environment state and the same acting role).
    """

    def __init__(self) -> None:
        self._seen: list[list[int]] | None = None

    def start(self) -> None:
        """A new batch: the next round is its first, one prompt per row."""
        self._seen = None

    def rows(self, prompt_ids: Sequence[Sequence[int]]) -> list[int]:
        """The batch row of each prompt of this round.

        Raises:
            RuntimeError: a prompt extends no row (TRL's loop changed).
        """
        if self._seen is None:
            self._seen = [[] for _ in prompt_ids]
            return list(range(len(prompt_ids)))
        rows, last = [], -1
        for ids in prompt_ids:
            head = list(ids)
            best = None
            for row in range(last + 1, len(self._seen)):
                seen = self._seen[row]
                if head[:len(seen)] == seen and (best is None or len(seen) > len(self._seen[best])):
                    best = row
            if best is None:
                raise RuntimeError("a tool-loop prompt extends no rollout of the batch; role routing needs trl 1.16's "
                                   "_tool_call_loop (prompt = the rollout so far + the tool result)")
            rows.append(best)
            last = best
        return rows

    def advance(self, rows: Sequence[int], prompt_ids: Sequence[Sequence[int]],
                completion_ids: Sequence[Sequence[int]]) -> None:
        """Record each row's tokens after this round (its prompt and what was generated)."""
        assert self._seen is not None, "rows() comes first"
        for row, prompt, completion in zip(rows, prompt_ids, completion_ids, strict=True):
            self._seen[row] = list(prompt) + list(completion)
