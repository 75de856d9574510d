"""Request failures: a request that failed is not an answer.

A client of the environment asks something over the network at every turn: a model endpoint
(``mathdebate eval``'s ``openai:`` policies, endpoint roles and teachers in training) or the env
server itself (``mathdebate play``). When such a request fails for good (an HTTP error, a
timeout, a dropped connection, a reply that is not a chat completion), after the client's own
retries, the episode it belonged to is *failed*: it is left out of every accuracy, reward and
pair, and counted with a typed reason and the first lines of the server's own message. It is
never graded as a wrong answer or a forfeit. (A forfeit that is the model's own doing, an
invalid tool call or a turn the server refuses, stays scored by the environment's rules.)

This module holds what every such client shares: :class:`RequestFailure` (one failure, typed),
:class:`FailureTally` (the run's requests, its failures by reason and one example message
each) and the exit rule of a run that mostly failed: :data:`FAILED_RUN_EXIT_CODE` when more
than :data:`DEFAULT_MAX_FAILED_SHARE` of the requests failed (each command has an option to
change the share). ``docs/failures.md`` describes it for users.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_MAX_FAILED_SHARE",
    "FAILED_RUN_EXIT_CODE",
    "FailureTally",
    "RequestFailure",
    "TooManyFailuresError",
    "first_lines",
]

#: The exit code of ``eval``, ``play``, ``train`` and ``ablate`` when more than the allowed share
#: of their requests failed (2 stays "bad arguments", 1 an unexpected error).
FAILED_RUN_EXIT_CODE = 3
#: The share of failed requests above which a run exits with :data:`FAILED_RUN_EXIT_CODE`.
DEFAULT_MAX_FAILED_SHARE = 0.05
#: How much of a server's error message is kept: its first lines, at most this many characters.
MESSAGE_LINES = 3
MESSAGE_CHARS = 400


def first_lines(text: str, lines: int = MESSAGE_LINES, chars: int = MESSAGE_CHARS) -> str:
    """The first ``lines`` non-blank lines of ``text``, joined by `` / ``, cut to ``chars``
    characters (an ellipsis marks a cut)."""
    kept = [line.strip() for line in str(text).splitlines() if line.strip()][:lines]
    joined = " / ".join(kept)
    return joined if len(joined) <= chars else joined[:chars - 1] + "…"


@dataclass(frozen=True)
class RequestFailure:
    """One request that failed for good (after the client's retries).

    Attributes:
        kind: the typed reason, a short slug: ``http_<status>`` (the server answered with an
            error status), ``timeout``, ``connection`` (refused, dropped mid-reply),
            ``malformed_reply`` (a 200 that is not a chat completion), ``generation_error``
            (a local model raised) or ``env_<code>`` (the env server's side: a lost session,
            no rewards record in time...).
        message: the first lines of the server's own message (:func:`first_lines`), else the
            client's description of the error.
        status: the HTTP status, where there was one.
    """

    kind: str
    message: str
    status: int | None = None

    def describe(self) -> str:
        """``kind: message`` on one line."""
        return f"{self.kind}: {self.message}" if self.message else self.kind

    def to_json(self) -> dict[str, Any]:
        """The failure as a JSON object (``kind``, ``message``, ``status``)."""
        return {"kind": self.kind, "message": self.message, "status": self.status}


class FailureTally:
    """A run's requests and failures, safe to update from several threads.

    Attributes:
        requests: requests made (failed ones included).
        failed: requests that failed for good.
        reasons: failures per :attr:`RequestFailure.kind`.
        examples: the first failure's message per kind.
        first: the run's first failure.
    """

    def __init__(self) -> None:
        self.requests = 0
        self.failed = 0
        self.reasons: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.first: RequestFailure | None = None
        self._lock = threading.Lock()

    def request(self, n: int = 1) -> None:
        """Count ``n`` requests made."""
        with self._lock:
            self.requests += n

    def fail(self, failure: RequestFailure) -> None:
        """Count one failed request (already counted by :meth:`request`) and its reason."""
        with self._lock:
            self.failed += 1
            self.reasons[failure.kind] += 1
            self.examples.setdefault(failure.kind, failure.message)
            if self.first is None:
                self.first = failure

    def merge(self, other: FailureTally) -> FailureTally:
        """A new tally holding both (this one's first failure and examples win)."""
        out = FailureTally()
        for tally in (self, other):
            with tally._lock:
                out.requests += tally.requests
                out.failed += tally.failed
                out.reasons.update(tally.reasons)
                for kind, message in tally.examples.items():
                    out.examples.setdefault(kind, message)
                out.first = out.first or tally.first
        return out

    @property
    def share(self) -> float:
        """Failed requests over requests (0 when none was made)."""
        return self.failed / self.requests if self.requests else 0.0

    def exceeds(self, max_share: float) -> bool:
        """Whether more than ``max_share`` of the requests failed (never with no failure)."""
        return self.failed > 0 and self.share > max_share

    def summary(self) -> dict[str, Any]:
        """``{"requests", "failed", "share", "reasons": {kind: {"count", "example"}}}``."""
        with self._lock:
            return {"requests": self.requests, "failed": self.failed, "share": round(self.share, 6),
                    "reasons": {kind: {"count": n, "example": self.examples.get(kind, "")}
                                for kind, n in self.reasons.most_common()}}

    def reasons_line(self) -> str:
        """The reasons on one line, most frequent first, each with its count and example:
        ``http_400 x40 ("This model's maximum context length is 1024 tokens...")``."""
        with self._lock:
            parts = [f"{kind} x{n}" + (f' ("{self.examples[kind]}")' if self.examples.get(kind) else "")
                     for kind, n in self.reasons.most_common()]
        return "; ".join(parts)

    def limit_message(self, what: str, max_share: float, option: str) -> str:
        """The line a command prints when it exits with :data:`FAILED_RUN_EXIT_CODE`: how many
        of ``what`` failed, the allowed share (``option`` names the flag that sets it) and the
        first server message."""
        first = f"; the first failure: {self.first.describe()}" if self.first is not None else ""
        return (f"{self.failed} of {self.requests} {what} failed ({100 * self.share:.1f}%, more than {option} "
                f"{100 * max_share:g}%){first}")


class TooManyFailuresError(RuntimeError):
    """A run in which more than the allowed share of requests failed: the command prints what
    it did, then this message, and exits :data:`FAILED_RUN_EXIT_CODE`.

    Attributes:
        output_dir: where the run's outputs were written (``None``: nowhere).
    """

    def __init__(self, message: str, output_dir: str | None = None) -> None:
        super().__init__(message)
        self.output_dir = output_dir
