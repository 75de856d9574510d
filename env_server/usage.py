"""A user's mistakes, told in one line: the one user-error type of the ``mathdebate`` commands.

A command that meets a mistake of the person running it (a path that is not there, a file that
is not what it should be, a server that cannot be reached or that refuses, a port in use, an
unknown name) raises :class:`UsageError` with a message that says what was wrong and what to
do. ``env_server.cli.main`` catches it, for every subcommand of ``mathdebate`` (the trainer's
commands run through it too), prints ``mathdebate <command>: <message>`` on stderr and exits
:data:`EXIT_USAGE`. Anything else that escapes a command is a bug: its traceback is printed with
:data:`REPORT_LINE` and the exit status is :data:`EXIT_INTERNAL`. ``--debug`` or
``MATHDEBATE_DEBUG=1`` shows the traceback of a usage error too.

Exit statuses (``docs/quickstart.md`` lists them): 0 done; 1 internal error; 2 usage error (bad
input, nothing was run or written); 3 a run whose failed requests passed the allowed share
(``--max-failed-share``: its outputs are written, ``docs/failures.md``).

The checks here are the boundary where user input enters a command; the library below raises its
own typed errors (``FileNotFoundError``, :class:`~env_server.jsonio.JSONLineError`, …), which the
commands turn into a :class:`UsageError` at that boundary with :func:`reading`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

__all__ = ["DEBUG_ENV", "EXIT_INTERNAL", "EXIT_USAGE", "REPORT_LINE", "UsageError", "debug_wanted", "first_line",
           "parse_server_url", "reading", "require_free_port", "require_server"]

EXIT_INTERNAL = 1
EXIT_USAGE = 2
#: Set to ``1`` to see the traceback of every error, usage errors included (as ``--debug``).
DEBUG_ENV = "MATHDEBATE_DEBUG"
#: The line printed under an internal error's traceback.
REPORT_LINE = ("mathdebate: this is a bug in mathdebate, not in how it was called: please report it on the project's "
               "issue tracker with the command, the traceback above and `pip show mathdebate`'s version")


class UsageError(Exception):
    """A mistake in how a command was called or what it was given: the message says what was wrong
    and what to do, in one line (newlines are folded when printed). Exit status 2.

    Args:
        message: what was wrong and what to do.
        command: the command to name before it (``mathdebate train``); default: the one run.
    """

    def __init__(self, message: str, command: str | None = None) -> None:
        super().__init__(message)
        self.command = command


def debug_wanted(argv: Sequence[str]) -> bool:
    """``--debug`` among the arguments, or ``MATHDEBATE_DEBUG`` set to anything but ``''``/``0``."""
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def first_line(exc: BaseException) -> str:
    """The exception's message on one line (a library's multi-line message folded at its first
    non-empty line), or its type's name when it has none."""
    text = str(exc).strip()
    if isinstance(exc, KeyError) and exc.args:  # str(KeyError('x')) is "'x'"
        text = str(exc.args[0]).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


@contextlib.contextmanager
def reading(what: str, hint: str) -> Iterator[None]:
    """Within the block, a file that cannot be read (``OSError``) or whose content is malformed
    (``ValueError``, ``KeyError``: a JSONL line, a YAML document, a problem without its fields)
    becomes ``UsageError("<what>: <reason>; <hint>")``.

    Keep the block to the one call that reads the user's input: an error of the code around it
    is a bug, not a usage error.

    Raises:
        UsageError: as above.
    """
    try:
        yield
    except UsageError:
        raise
    except OSError as exc:
        reason = exc.strerror if exc.strerror and exc.filename else first_line(exc)
        where = f" {exc.filename}" if exc.filename else ""
        raise UsageError(f"{what}:{where} {reason}; {hint}") from exc
    except (ValueError, KeyError) as exc:
        raise UsageError(f"{what}: {first_line(exc)}; {hint}") from exc


def parse_server_url(url: str, flag: str) -> str:
    """``url`` checked to be an ``http(s)://host[:port]`` URL (a trailing ``/`` removed).

    Raises:
        UsageError: not such a URL, or a port that is not a number in 1-65535.
    """
    parts = urlsplit(url.strip())
    example = "e.g. http://127.0.0.1:8000"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{flag} {url!r} is not an http(s) URL of an env server ({example})")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"{flag} {url!r} has no valid port ({example})")
    return url.strip().rstrip("/")


def require_server(urls: Sequence[str], flag: str, timeout_s: float = 5.0, token: str | None = None) -> None:
    """Each URL answers ``GET /health`` with 200, as a mathdebate env server does.

    Raises:
        UsageError: a URL that is not an http(s) URL, nothing listening there (refused, unknown
            host, timed out), or a server that answers but refuses (any other status: not an env
            server, or a proxy in front of none).
    """
    import httpx  # here: the server's own commands never need an HTTP client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for raw in urls:
        url = parse_server_url(raw, flag)
        try:
            status = httpx.get(f"{url}/health", timeout=timeout_s, headers=headers).status_code
        except httpx.HTTPError as exc:
            raise UsageError(f"cannot reach the env server at {url} ({first_line(exc)}): start one with "
                             f"`mathdebate serve --port N` or pass its URL with {flag}") from exc
        if status != 200:
            raise UsageError(f"the server at {url} refused: GET /health answered {status}, not 200 (is it a mathdebate "
                             f"env server, and is the auth token right?); pass an env server's URL with {flag}")


def require_free_port(host: str, port: int) -> None:
    """Nothing listens on ``host:port`` yet (the check a server makes before it starts, so that a
    port in use is one line rather than the web server's log of a failed bind).

    Raises:
        UsageError: the port is in use, or the address cannot be bound here.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is in use: stop what listens there or pass another --port") \
                    from exc
            raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror}): pass another --host or --port") from exc
