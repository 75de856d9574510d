"""The command line and the container recipe, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from env_server.cli import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]


def mathdebate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "env_server.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_play_reference_policy_on_builtin_problems(server_url) -> None:
    done = mathdebate("play", "--url", server_url, "--episodes", "60", "--concurrency", "16",
                      "--policy", "reference", "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    summary = last_json(done.stdout)
    assert summary["episodes"] == 60 and summary["failed"] == 0
    assert summary["accuracy"] == 1.0 and summary["reward/solver"] == 1.0 and summary["reward/verifier"] == 1.0
    assert "accuracy (episode reward)" in done.stdout  # the table is printed


def test_play_on_math500(math500_server_url, math500_path) -> None:
    done = mathdebate("play", "--url", math500_server_url, "--problems", str(math500_path), "--episodes", "120",
                      "--concurrency", "24", "--policy", "noisy", "--p", "0.3", "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    summary = last_json(done.stdout)
    assert summary["episodes"] == 120 and summary["failed"] == 0
    # noisy: some answers wrong, most right; the verifier catches most wrong ones
    assert 0.5 < summary["first_answer_accuracy"] < 0.95
    assert summary["accuracy"] > summary["first_answer_accuracy"] - 0.05
    assert summary["error_kinds"].get("wrong_answer", 0) > 0


def test_play_with_mismatched_problem_sets_fails_clearly(server_url, math500_path) -> None:
    done = mathdebate("play", "--url", server_url, "--problems", str(math500_path), "--episodes", "2", "--no-progress")
    assert done.returncode != 0
    assert "give `play` the same --problems as `serve`" in done.stderr


def test_compose_env_service_command_serves_and_passes_its_healthcheck() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["env"]
    port = free_port()
    # Run the service's command as a local process (no Docker engine in CI), on a free
    # loopback port instead of 0.0.0.0:8000.
    command = [str(part) for part in env["command"]]
    command = [c.replace("0.0.0.0", "127.0.0.1").replace("8000", str(port)) for c in command]
    assert command[0] == "mathdebate"
    process = subprocess.Popen([sys.executable, "-m", "env_server.cli", *command[1:]], cwd=REPO)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=60, process=process)
        probe = [str(part).replace("8000", str(port)) for part in env["healthcheck"]["test"]]
        assert probe[0] == "CMD"
        check = subprocess.run([sys.executable if p == "python" else p for p in probe[1:]], timeout=30,
                               env={**os.environ})
        assert check.returncode == 0
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert env["ports"] == ["8000:8000"]


def test_readme_demo_command_on_math500_serves_and_plays_only(math500_path) -> None:
    """The README's ``./scripts/demo.sh --problems ../shared/data/math500.jsonl`` with
    ``--train-steps 0`` (serve and play only) and fewer episodes, through ``mathdebate demo`` as
    the script runs it: the server it starts serves the given problems (it used to start on the
    built-in generator and the play refused with "the server serves another problem set")."""
    done = subprocess.run([sys.executable, "-m", "trainer_client.cli", "demo", "--problems", str(math500_path),
                           "--episodes", "20", "--train-steps", "0", "--policy", "reference", "--no-progress"],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "math500.jsonl" in done.stdout and "episodes graded" in done.stdout
    assert "training" not in done.stdout  # --train-steps 0: no training part
    assert "demo.sh" in (REPO / "README.md").read_text() and "--problems ../shared/data/math500.jsonl" in (
        REPO / "README.md").read_text()


def test_a_renamed_play_option_fails_with_one_line_naming_the_new_one(capsys) -> None:
    from env_server.cli import main as server_main

    assert server_main(["play", "--replay-after", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mathdebate play: --replay-after is now --rerun-after (see mathdebate play --help)"]
