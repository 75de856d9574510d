"""OpenEnv 0.10 (the ``openenv`` distribution): its stock client, ``openenv validate`` on the
repository and on a running server, and its runtime-level collector and graders, against the
real server.

``openenv==0.10.x`` and ``openenv-core==0.3.0`` (the test environment's, see
``test_openenv_compat.py``) install the same import package, so 0.10 lives in its own virtual
environment, created once by this module in ``$XDG_CACHE_HOME/mathdebate/openenv010-venv``
(default ``~/.cache``; outside the repository, whose source ``openenv validate`` digests; about
45 s and 480 MB on first use, reused while its marker file names the same requirement) and
driven through subprocesses (``tests/helpers/openenv010_probe.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env_server.cli import running_server

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mathdebate" / "openenv010-venv"
REQUIREMENT = "openenv==0.10.*"
PROBE = Path(__file__).resolve().parents[1] / "helpers" / "openenv010_probe.py"


@pytest.fixture(scope="module")
def openenv010() -> Path:
    """The 0.10 environment's bin directory (created on first use)."""
    marker = VENV / "mathdebate-requirement.txt"
    python = VENV / "bin" / "python"
    if not (marker.exists() and marker.read_text() == REQUIREMENT and python.exists()):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        # --no-compile: bytecode on first import, for what is imported (scripts/setup_env.sh says why)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                        REQUIREMENT], check=True, timeout=280)
        marker.write_text(REQUIREMENT)
    return VENV / "bin"


def _probe(bin_dir: Path, url: str) -> dict:
    out = subprocess.run([str(bin_dir / "python"), str(PROBE), url, str(ROOT)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


def _validate(bin_dir: Path, *args: str) -> dict:
    out = subprocess.run([str(bin_dir / "openenv"), "validate", *args, "--json"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_stock_010_client_and_runtime_graders_pass(openenv010, server_url):
    result = _probe(openenv010, server_url)
    assert result["openenv_version"].startswith("0.10.")
    steps = result["client"]["steps"]
    assert steps[0]["reward"] is None and steps[0]["role"] == "solver"  # reset: null is allowed
    # sparse numeric rewards: 0.0 before the terminal step, which carries the graded episode reward
    assert [s["reward"] for s in steps[1:-1]] == [0.0] * (len(steps) - 2)
    assert steps[-1]["done"] and steps[-1]["reward"] == 0.0 and steps[-1]["metadata"]["grading"] == "graded"
    assert any(s["metadata"]["error_kind"] == "circular_critique" for s in steps[1:])  # markers reach 0.10 clients
    assert result["client"]["state"]["step_count"] == len(steps) - 1
    runtime = result["runtime"]
    assert runtime["failure_reason"] is None and runtime["exchanges"][:3] == ["reset", "state", "step"]
    assert {check: r["status"] for check, r in runtime["checks"].items()} == {
        "runtime.reward_well_formed": "pass", "runtime.observation_schema": "pass", "runtime.state_contract": "pass"}


def test_null_step_rewards_fail_the_runtime_reward_check(openenv010):
    with running_server(["--step-reward", "none", "--grading-workers", "1"]) as url:
        result = _probe(openenv010, url)
    assert [s["reward"] for s in result["client"]["steps"][1:-1]] == [None] * (len(result["client"]["steps"]) - 2)
    check = result["runtime"]["checks"]["runtime.reward_well_formed"]
    assert check["status"] == "fail" and "reward must be finite and in range" in check["evidence"][0]


def test_openenv_validate_on_the_repository_and_the_server(openenv010, server_url):
    static = _validate(openenv010, ".", "--skip-build")
    statuses = {r["check_id"]: r["status"] for r in static["results"]}
    assert statuses["static.manifest"] == "pass" and "fail" not in statuses.values()
    assert static["verdict"] in ("pass", "warn")  # warn: the build-dependent levels are skipped
    runtime = _validate(openenv010, "--url", server_url)
    assert runtime["passed"] and runtime["summary"]["failed_criteria"] == []


HARNESS_PROBE = Path(__file__).resolve().parents[1] / "helpers" / "openenv010_harness_probe.py"


def test_010_collect_runner_plays_debates_through_the_harness_session_factory(openenv010, server_url, tmp_path):
    """OpenEnv 0.10's own CollectRunner (not 0.3.0's, which test_harness.py runs) with our
    factory: every reward it writes is the server's record of that episode."""
    import urllib.request

    out = subprocess.run([str(openenv010 / "python"), str(HARNESS_PROBE), server_url, str(ROOT), str(tmp_path), "4"],
                         capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["openenv"].startswith("0.10.") and (result["collected"], result["failed"]) == (4, 0)
    for episode in result["episodes"]:
        with urllib.request.urlopen(f"{server_url}/episodes/{episode['server_episode_id']}/rewards") as response:
            assert json.loads(response.read())["record"]["episode_reward"] == episode["reward"]
