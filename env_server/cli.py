"""The ``mathdebate`` command line.

- ``mathdebate serve``: run the environment server.
- ``mathdebate play``: drive scripted debates against a server and print a report.
- ``mathdebate view``: the debate viewer on a trajectory file (``env_server.viewer.command``).
- ``mathdebate train``, ``mathdebate tiny-model``, ``mathdebate demo``: see ``trainer_client.cli``.

Every subcommand, the trainer's included, runs through :func:`main`: a user's mistake
(:class:`~env_server.usage.UsageError`, argparse's own errors among them) is one line on stderr
and exit 2; a run past its allowed share of failed requests exit 3; anything else is a bug, its
traceback and where to report it, exit 1 (``env_server.usage``). ``--debug`` or
``MATHDEBATE_DEBUG=1`` shows the traceback of every error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from env_server.client.failures import DEFAULT_MAX_FAILED_SHARE, FAILED_RUN_EXIT_CODE, TooManyFailuresError
from env_server.grading.pool import GradingConfig
from env_server.protocol.markers import EpisodeMode
from env_server.service.config import AUTH_TOKEN_ENV, ServerConfig
from env_server.usage import (
    DEBUG_ENV,
    EXIT_INTERNAL,
    EXIT_USAGE,
    REPORT_LINE,
    UsageError,
    debug_wanted,
    reading,
    require_free_port,
    require_server,
)
from env_server.viewer.command import add_view_command

if TYPE_CHECKING:
    from env_server.client.play import PlayReport

__all__ = ["PROBLEMS_HINT", "build_parser", "load_problems", "main", "require_play_servers"]

#: What to do about a ``--problems`` that cannot be read.
PROBLEMS_HINT = "pass a JSONL file in MATH-500 or GSM8K format, hf:<dataset>[:<split>] or gen:<family>"


def load_problems(spec: str | None, flag: str = "--problems") -> Any:
    """The problem source of a command's ``--problems`` (``None``: the built-in generator).

    Raises:
        UsageError: a file that is not there or not problems, or an unknown source.
    """
    from env_server.debate.problems import load_problem_source

    with reading(flag, PROBLEMS_HINT):
        return load_problem_source(spec)


def _add_serve_args(parser: argparse.ArgumentParser) -> None:
    defaults = ServerConfig.model_construct()
    grading = GradingConfig.model_construct()
    parser.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--problems", default=None,
                        help="JSONL in MATH-500 or GSM8K format, hf:<dataset>[:<split>], or gen:<family>[,...] "
                             "(e.g. gen:single_digit_sum); default: built-in generator")
    parser.add_argument("--max-rounds", type=int, default=defaults.max_rounds)
    parser.add_argument("--mode", choices=[m.value for m in EpisodeMode], default=defaults.mode.value,
                        help="episode mode of a reset that names none: debate (solver, verifier, judge) or "
                             "single (one solver answer, graded)")
    parser.add_argument("--circular-critique-stop", action=argparse.BooleanOptionalAction,
                        default=defaults.circular_critique_stop,
                        help="send a debate to the judge at once when the solver re-submits a rejected answer "
                             "or the verifier repeats its previous review")
    parser.add_argument("--max-action-chars", type=int, default=defaults.max_action_chars)
    parser.add_argument("--max-sessions", type=int, default=defaults.max_sessions)
    parser.add_argument("--max-sessions-per-connection", type=int, default=defaults.max_sessions_per_connection)
    parser.add_argument("--max-frame-bytes", type=int, default=defaults.max_frame_bytes)
    parser.add_argument("--resume-window", type=float, default=defaults.resume_window_s, help="seconds")
    parser.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout_s, help="seconds")
    parser.add_argument("--retention", type=float, default=defaults.retention_s, help="seconds graded episodes are kept")
    parser.add_argument("--max-retained-episodes", type=int, default=defaults.max_retained_episodes)
    parser.add_argument("--reap-interval", type=float, default=defaults.reap_interval_s,
                        help="seconds between expiry sweeps (resume windows, idle sessions, retention)")
    parser.add_argument("--shutdown-grace", type=float, default=defaults.shutdown_grace_s, help="seconds")
    parser.add_argument("--step-reward", choices=["sparse", "none"], default=defaults.step_reward,
                        help="the reward of a step on the OpenEnv routes (/ws, POST /step): sparse (0.0 until the "
                             "terminal step, which carries the episode reward) or none (null until then); per-turn "
                             "rewards stay on the delayed channel")
    parser.add_argument("--trajectory-log", default=None, help="JSONL file: one line per graded episode")
    parser.add_argument("--state-dir", default=None,
                        help="journal sessions, open episodes and graded records in this directory so that a "
                             "restart with the same directory resumes them (README: Running for days); "
                             "default: memory only")
    parser.add_argument("--state-fsync-interval", type=float, default=defaults.state_fsync_interval_s,
                        help="seconds between fsyncs of the state journal (0: every write)")
    parser.add_argument("--state-compact-bytes", type=int, default=defaults.state_compact_bytes,
                        help="rewrite the state journal as a snapshot of the live state past this size")
    parser.add_argument("--grading-workers", type=int, default=None, help="default: CPU count")
    parser.add_argument("--grading-timeout", type=float, default=grading.hard_timeout_s, help="hard kill, seconds")
    parser.add_argument("--grading-fairness", choices=["on", "off"], default="on" if grading.fairness else "off",
                        help="per-session fair admission to the grading workers: a session's grades wait behind "
                             "its own, not other sessions' (off: first come, first served)")
    parser.add_argument("--log-level", default="info")


def _serve_config(args: argparse.Namespace) -> ServerConfig:
    grading: dict[str, Any] = {"hard_timeout_s": args.grading_timeout, "fairness": args.grading_fairness == "on"}
    if args.grading_workers is not None:
        grading["workers"] = args.grading_workers
    return ServerConfig(
        problems=args.problems,
        max_rounds=args.max_rounds,
        mode=EpisodeMode(args.mode),
        circular_critique_stop=args.circular_critique_stop,
        max_action_chars=args.max_action_chars,
        max_sessions=args.max_sessions,
        max_sessions_per_connection=args.max_sessions_per_connection,
        max_frame_bytes=args.max_frame_bytes,
        resume_window_s=args.resume_window,
        idle_timeout_s=args.idle_timeout,
        retention_s=args.retention,
        max_retained_episodes=args.max_retained_episodes,
        shutdown_grace_s=args.shutdown_grace,
        reap_interval_s=args.reap_interval,
        trajectory_log=args.trajectory_log,
        state_dir=args.state_dir,
        state_fsync_interval_s=args.state_fsync_interval,
        state_compact_bytes=args.state_compact_bytes,
        step_reward=args.step_reward,
        grading=GradingConfig(**grading),
    )


def tune_gc() -> None:
    """Collect the young generation every 50,000 allocations instead of 700, and move what
    exists at start-up (modules, the problem set) out of the collector's view.

    A busy server holds tens of thousands of long-lived objects (sessions, retained episodes)
    and creates few reference cycles, so CPython's default thresholds spend a noticeable share
    of the event loop's time in collections that free little (``benchmarks/README.md``); this
    is the usual tuning for such servers
    (``gc.freeze`` exists for it).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM (graceful: in-flight grading may finish)."""
    import uvicorn

    from env_server.app import create_app
    from env_server.service.facade import DebateService

    config = _serve_config(args)
    problems = load_problems(config.problems)
    require_free_port(args.host, args.port)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(config, DebateService(config, problems=problems))
    tune_gc()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # Larger than our own frame limit, so an oversize frame gets a FRAME_TOO_LARGE error
        # frame from us instead of a protocol-level close.
        ws_max_size=max(16 << 20, 4 * config.max_frame_bytes),
        ws_ping_interval=20,
        ws_ping_timeout=60,
        timeout_graceful_shutdown=max(1, int(config.shutdown_grace_s)),
    )
    return 0


def add_play_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32, help="debates in flight at once")
    parser.add_argument("--connections", type=int, default=1, help="WebSocket connections to spread sessions over")
    parser.add_argument("--policy", choices=["reference", "noisy"], default="noisy")
    parser.add_argument("--p", type=float, default=0.3, help="error probability of the noisy policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rounds", type=int, default=None)
    parser.add_argument("--mode", choices=[m.value for m in EpisodeMode], default=None,
                        help="episode mode of every reset (default: the server's --mode)")
    parser.add_argument("--problems", default=None, help="the same problem source the server serves")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line at the end")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--max-failed-share", type=float, default=DEFAULT_MAX_FAILED_SHARE,
                        help="exit 3 when more than this share of the episodes failed on the env server's side "
                             f"(not graded in time, replica lost, protocol error; default {DEFAULT_MAX_FAILED_SHARE:g})")


def print_report(report: PlayReport, title: str) -> None:
    from rich.table import Table

    from env_server.tables import print_whole

    summary = report.summary()
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("episodes graded", f"{summary['episodes']}"),
        ("episodes failed", f"{summary['failed']}"),
        ("accuracy (episode reward)", f"{summary['accuracy']:.3f}"),
        ("first-answer accuracy", f"{summary['first_answer_accuracy']:.3f}"),
        ("judge accuracy", "n/a" if summary["judge_accuracy"] is None else f"{summary['judge_accuracy']:.3f}"),
    ]
    rows += [(f"mean reward: {role}", "n/a" if summary[f"reward/{role}"] is None else f"{summary[f'reward/{role}']:.3f}")
             for role in ("solver", "verifier", "judge")]
    rows += [(f"error kind: {kind}", str(n)) for kind, n in sorted(report.error_kinds.items())]
    if len(report.per_replica) > 1 or report.reruns:
        rows += [(f"episodes on {url}", str(n)) for url, n in sorted(report.per_replica.items())]
        rows += [("episodes re-run elsewhere", str(report.reruns))]
    rows += [
        ("steps/s", f"{summary['steps_per_s']:.1f}"),
        ("step latency p50 / p99 (ms)", f"{summary['step_p50_ms']:.2f} / {summary['step_p99_ms']:.2f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    print_whole(table)  # whole when piped to a file too (rich would cut cells at 80 columns)


class _Renamed(argparse.Action):
    """An option that was renamed: using it fails with one line naming the new one (exit 2)."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is now {self.new}")


def cmd_play(args: argparse.Namespace) -> int:
    """Play scripted debates against ``--url`` and print the report. Failed episodes are not
    scored: when any failed, the first line says how many and why; exit 3 when more than
    ``--max-failed-share`` of the episodes failed (``docs/failures.md``), else 0."""
    from env_server.client.play import play

    problems = load_problems(args.problems)
    require_play_servers(args.url, "--url")
    report = asyncio.run(play(
        args.url, problems, args.episodes, args.concurrency, args.policy, args.p, args.seed, args.connections,
        token=os.environ.get(AUTH_TOKEN_ENV) or None, max_rounds=args.max_rounds, progress=not args.no_progress,
        mode=args.mode, rerun_after_s=getattr(args, "rerun_after", 30.0),
    ))
    tally = report.failures
    if tally.failed:  # the first thing the user reads
        print(f"FAILED: {tally.failed} of {tally.requests} episodes failed and are not scored: {tally.reasons_line()}",
              flush=True)
    print_report(report, f"mathdebate play: {args.policy} policy on {problems.name}")
    if args.json:
        print(json.dumps(report.summary()))
    max_share = getattr(args, "max_failed_share", DEFAULT_MAX_FAILED_SHARE)
    if tally.exceeds(max_share):
        print(f"mathdebate play: {tally.limit_message('episodes', max_share, '--max-failed-share')}", file=sys.stderr)
        return FAILED_RUN_EXIT_CODE
    return 0


def require_play_servers(urls: str, flag: str) -> None:
    """Every comma-separated URL of ``urls`` is an env server that answers (the token of
    ``MATHDEBATE_AUTH_TOKEN`` sent where set).

    Raises:
        UsageError: a malformed URL, a server that cannot be reached or that refuses.
    """
    from env_server.client.replicas import parse_urls

    with reading(flag, "e.g. http://127.0.0.1:8000 or several replicas comma-separated"):
        parsed = parse_urls(urls)
    require_server(parsed, flag, token=os.environ.get(AUTH_TOKEN_ENV) or None)


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(url: str, timeout_s: float = 60.0, process: subprocess.Popen[Any] | None = None,
                 path: str = "/health") -> None:
    """Poll ``url`` + ``path`` (default ``/health``) until it answers 200.

    Raises:
        RuntimeError: the server process exited, or it did not become healthy in time.
    """
    import httpx  # here: `serve` itself never needs an HTTP client

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} was not healthy after {timeout_s:.0f}s")


@contextlib.contextmanager
def running_server(extra_args: Sequence[str] = (), port: int | None = None,
                   env: dict[str, str] | None = None, cwd: str | None = None) -> Iterator[str]:
    """Start ``mathdebate serve`` in a subprocess; yield its URL; stop it with SIGTERM.

    Args:
        extra_args: more ``serve`` arguments.
        port: the port (default: a free one).
        env: extra environment variables for the server (e.g. the auth token).
        cwd: the server's working directory (default: this process's); ``python -m`` puts it
            first on the import path.
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "env_server.cli", "serve", "--port", str(port), "--log-level", "warning", *extra_args]
    process = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process=process)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are a :class:`UsageError` (one line, exit 2 through
    :func:`main`) rather than its usage block and ``sys.exit(2)``; subcommands' parsers are of
    this class too (argparse makes them of the parent's class)."""

    def error(self, message: str) -> typing.NoReturn:  # argparse's hook for every parse error
        raise UsageError(f"{message} (see {self.prog} --help)", command=self.prog)


def build_parser(extra_commands: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """The ``mathdebate`` parser. ``extra_commands`` add subcommands (the trainer adds
    ``train`` and ``tiny-model``; the server side never imports the trainer)."""
    parser = _Parser(prog="mathdebate", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of any error, a usage error too (or set {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the environment server")
    _add_serve_args(serve)
    serve.set_defaults(func=cmd_serve)
    play = sub.add_parser("play", help="drive scripted debates over /ws/mux and print a report")
    play.add_argument("--url", default="http://127.0.0.1:8000",
                      help="the server, or several replicas comma-separated (sessions go to the least-loaded)")
    play.add_argument("--rerun-after", type=float, default=30.0,
                      help="seconds a session's replica may stay unreachable before its episode is re-run elsewhere")
    play.add_argument("--replay-after", type=float, help=argparse.SUPPRESS,
                      action=_Renamed, new="--rerun-after")
    add_play_args(play)
    play.set_defaults(func=cmd_play)
    add_view_command(sub)
    for add in extra_commands:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None, extra_commands: Sequence[Callable[[Any], None]] = ()) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run its command; the one place a command's
    errors become exit statuses (``env_server.usage``).

    Returns:
        The command's own status (0, or 3 for a run past its failed share), 2 for a
        :class:`UsageError`, 3 for :class:`TooManyFailuresError`, 1 for any other exception
        (printed with its traceback and :data:`REPORT_LINE`), 130 on Ctrl-C.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_wanted(argv)
    argv = [a for a in argv if a != "--debug"]  # anywhere, not only before the command
    command = "mathdebate" + (f" {argv[0]}" if argv and not argv[0].startswith("-") else "")
    try:
        args = build_parser(extra_commands).parse_args(argv)
        code: int = args.func(args)
        return code
    except UsageError as exc:
        if debug:
            traceback.print_exc()
        print(f"{exc.command or command}: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except TooManyFailuresError as exc:  # what is written was written; the status says it failed
        if debug:
            traceback.print_exc()
        print(f"{command}: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return FAILED_RUN_EXIT_CODE
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception:
        traceback.print_exc()
        print(REPORT_LINE, file=sys.stderr, flush=True)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
