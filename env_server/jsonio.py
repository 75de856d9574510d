"""JSON files, the project's one way: written atomically (fsynced, then renamed into place), and
JSONL read line by line.

Used by both halves (the server's provenance, the trainer's checkpoints, ablate's run results,
the viewer, problem files, the session ledger, pair stores, run logs and exported episodes); the
standard library's ``json`` underneath.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["JSONLineError", "read_jsonl", "write_json_atomic"]


class JSONLineError(ValueError):
    """A line of a JSONL file that is not JSON.

    Attributes:
        path: the file.
        line: the line's number (1-based).
        reason: why, e.g. ``not JSON (Expecting value at column 1)``.
    """

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = None,
                      default: Callable[[Any], Any] | None = None) -> Path:
    """Write ``data`` as JSON to ``path`` so that a reader (or a restart after a crash) sees the
    old file or the whole new one, never a part: a temporary file beside it, flushed and
    fsynced, renamed over ``path``, then the folder fsynced. Creates the folder.

    Args:
        path: the file.
        data: JSON data (``default`` converts what ``json`` cannot hold).
        indent: ``json.dumps``'s indent (``None``: one line); a trailing newline is written.

    Returns:
        ``path``.

    Raises:
        OSError: the folder or the file cannot be written.
        TypeError: ``data`` holds a value JSON cannot hold and ``default`` does not convert.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=indent, default=default) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def read_jsonl(path: str | Path, on_bad_line: Callable[[JSONLineError], None] | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSONL file, in order.

    Args:
        path: the file.
        on_bad_line: called with the error of a line that is not JSON (e.g. torn by a kill),
            which is then skipped; it may raise its own error instead. ``None``: the error is
            raised.

    Raises:
        FileNotFoundError: no such file.
        JSONLineError: a line that is not JSON, without ``on_bad_line``.
    """
    path = Path(path)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
                reason = (f"not JSON ({exc.msg} at column {exc.colno})" if isinstance(exc, json.JSONDecodeError)
                          else f"not JSON ({exc})")
                error = JSONLineError(path, number, reason)
                if on_bad_line is None:
                    raise error from None
                on_bad_line(error)
                continue
            yield number, value
