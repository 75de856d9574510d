"""Errors a person reads: every ordinary mistake × every ``mathdebate`` subcommand it applies to
ends in exit 2 with exactly one line on stderr and no traceback (``env_server.usage``).

Each case runs the real command in a subprocess, against real sockets: a real env server (the
session's), nothing listening (a port just freed), a server that answers but is not an env server
(a plain HTTP server answering 404), a port some other socket holds.
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from env_server.cli import free_port
from env_server.usage import REPORT_LINE

MISSING = "missing"
MALFORMED = "malformed"
UNREACHABLE = "unreachable"
REFUSING = "refusing"
BAD_URL = "bad-url"
PORT_IN_USE = "port-in-use"


@pytest.fixture(scope="module")
def places(tmp_path_factory, server_url) -> Iterator[dict[str, str]]:
    """The inputs of the table: paths, URLs and a held port."""
    root = tmp_path_factory.mktemp("cli-errors")
    bad_jsonl = root / "bad.jsonl"
    bad_jsonl.write_text('{"problem": "1+1", "answer": "2"}\n{not json\n')
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("learning_rate: [1e-4\n")
    refusing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        yield {"missing": str(root / "missing.jsonl"), "bad_jsonl": str(bad_jsonl), "bad_yaml": str(bad_yaml),
               "unreachable": f"http://127.0.0.1:{free_port()}", "refusing": f"http://127.0.0.1:{refusing.server_port}",
               "held_port": str(held.getsockname()[1]), "server": server_url, "out": str(root / "out")}
    finally:
        refusing.shutdown()
        held.close()


#: (subcommand, mistake, arguments with {placeholders} of ``places``, a word the line must hold).
CASES = [
    # serve
    ("serve", MISSING, ["--problems", "{missing}"], "not found"),
    ("serve", MALFORMED, ["--problems", "{bad_jsonl}"], "bad.jsonl:1"),
    ("serve", "problems source", ["--problems", "gen:no_such_family"], "no_such_family"),
    ("serve", PORT_IN_USE, ["--port", "{held_port}"], "in use"),
    # play
    ("play", MISSING, ["--url", "{server}", "--problems", "{missing}"], "not found"),
    ("play", UNREACHABLE, ["--url", "{unreachable}"], "cannot reach"),
    ("play", REFUSING, ["--url", "{refusing}"], "refused"),
    ("play", BAD_URL, ["--url", "not-a-url"], "not an http(s) URL"),
    # view
    ("view", MISSING, ["{missing}"], "No such file"),
    ("view", MALFORMED, ["{bad_yaml}"], "malformed"),
    ("view", PORT_IN_USE, ["{bad_jsonl}", "--port", "{held_port}"], "in use"),
    # train
    ("train", MISSING, ["--config", "{missing}", "--env-url", "{server}"], "missing.jsonl"),
    ("train", MALFORMED, ["--config", "{bad_yaml}", "--env-url", "{server}"], "invalid configuration"),
    ("train", UNREACHABLE, ["--env-url", "{unreachable}"], "cannot reach"),
    ("train", REFUSING, ["--env-url", "{refusing}"], "refused"),
    ("train", BAD_URL, ["--env-url", "not-a-url"], "not an http(s) URL"),
    ("train", "unknown model", ["--env-url", "{server}", "--model", "{missing}-model"], "--model"),
    ("train", "preset", ["--preset", "no_such_preset"], "no_such_preset"),
    ("train", "config key", ["-o", "no_such_key=1"], "no_such_key"),
    ("train", "estimator", ["--advantage-estimator", "no_such_estimator"], "no_such_estimator"),
    # eval
    ("eval", MISSING, ["--problems", "{missing}", "--env-url", "{server}"], "not found"),
    ("eval", MALFORMED, ["--problems", "{bad_jsonl}", "--env-url", "{server}"], "bad.jsonl:1"),
    ("eval", UNREACHABLE, ["--env-url", "{unreachable}"], "cannot reach"),
    ("eval", REFUSING, ["--env-url", "{refusing}"], "refused"),
    ("eval", BAD_URL, ["--env-url", "not-a-url"], "not an http(s) URL"),
    ("eval", "policy spec", ["--env-url", "{server}", "--policy", "no_such_policy:x"], "--policy"),
    ("eval", "unknown model", ["--env-url", "{server}", "--policy", "hf:{missing}-model"], "--policy"),
    # ablate
    ("ablate", "preset", ["--arms", "no_such_arm"], "no_such_arm"),
    ("ablate", "config key", ["-o", "no_such_key=1", "--env-url", "{server}"], "no_such_key"),
    ("ablate", "unknown model", ["--model", "{missing}-model", "--env-url", "{server}"], "--model"),
    ("ablate", UNREACHABLE, ["--env-url", "{unreachable}"], "cannot reach"),
    ("ablate", REFUSING, ["--env-url", "{refusing}"], "refused"),
    ("ablate", BAD_URL, ["--env-url", "not-a-url"], "not an http(s) URL"),
    ("ablate", MISSING, ["--config", "{missing}"], "missing.jsonl"),
    # export
    ("export", MISSING, ["{missing}", "--output-dir", "{out}"], "missing.jsonl"),
    ("export", MALFORMED, ["{bad_yaml}", "--output-dir", "{out}"], "bad.yaml"),
    # demo
    ("demo", MISSING, ["--problems", "{missing}"], "not found"),
    # the command itself
    ("no-such-command", "command", [], "invalid choice"),
]


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer_client.cli", *argv], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                            **(env or {})})


@pytest.mark.slow
@pytest.mark.parametrize(("command", "mistake", "args", "word"), CASES,
                         ids=[f"{c}-{m.replace(' ', '-')}" for c, m, _, _ in CASES])
def test_a_mistake_is_one_line_and_exit_2(places, command: str, mistake: str, args: list[str], word: str) -> None:
    done = _run([command, *(a.format(**places) for a in args)])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1, lines
    assert re.match(r"mathdebate( [a-z-]+)?: ", lines[0]), lines
    assert word in lines[0], lines[0]


def test_debug_shows_the_traceback_of_a_usage_error(places) -> None:
    for env, flag in (({}, ["--debug"]), ({"MATHDEBATE_DEBUG": "1"}, [])):
        done = _run([*flag, "serve", "--problems", places["missing"]], env)
        assert done.returncode == 2
        assert "Traceback" in done.stderr and "FileNotFoundError" in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("mathdebate serve: --problems")


def _crash(args) -> int:
    raise RuntimeError("a bug")


def _add_crash(sub) -> None:
    sub.add_parser("crash").set_defaults(func=_crash)


def test_an_internal_error_keeps_its_traceback_and_says_where_to_report(capsys) -> None:
    from env_server.cli import main

    assert main(["crash"], extra_commands=[_add_crash]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug" in err
    assert err.strip().splitlines()[-1] == REPORT_LINE


def test_the_docs_list_the_exit_codes() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "quickstart.md").read_text()
    for code in ("0", "1", "2", "3"):
        assert f"| {code} |" in text
