"""verifiers' own ``vf-eval`` on the ``math-debate`` environment, from its own virtual environment.

verifiers 0.4.0 pins ``mcp==2.0.0``, and the test environment's ``openenv-core`` 0.3.0 imports
fastmcp 4's client, which needs a later ``mcp`` (with 2.0.0 installed,
``trainer_client.rollout.harness`` fails at import: "FastMCP client support is not installed").
So, like OpenEnv 0.10 (``test_openenv010.py``), verifiers lives beside the test environment: this
project with its ``verifiers`` extra (no torch) and ``uv`` (verifiers prepares its chat harness's
program, a PEP 723 script, with it), in ``$XDG_CACHE_HOME/mathdebate/verifiers-venv``, created on
first use (under a file lock: the vLLM check and the suite may both ask at once; about a minute
cold) and reused while its marker names the same requirements and this checkout.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mathdebate" / "verifiers-venv"
#: The uv that prepares verifiers' chat program (the test extra's pin).
UV = "uv==0.13.8"


def _requirement() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lists = [project["dependencies"], project["optional-dependencies"]["verifiers"], UV]
    return hashlib.sha256(json.dumps(lists, sort_keys=True).encode()).hexdigest()[:16]


def verifiers_bin() -> Path:
    """The verifiers environment's ``bin`` directory (built or re-pointed at this checkout first).

    Raises:
        subprocess.CalledProcessError: an install failed.
    """
    VENV.parent.mkdir(parents=True, exist_ok=True)
    python = VENV / "bin" / "python"
    marker, checkout = VENV / "mathdebate-requirement.txt", VENV / "mathdebate-checkout.txt"
    with open(VENV.parent / "verifiers-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (python.exists() and marker.exists() and marker.read_text() == _requirement()):
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            # --no-compile: bytecode on first import, for what is imported (scripts/setup_env.sh says why)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                            "-e", f"{ROOT}[verifiers]", UV], check=True, timeout=600)
            marker.write_text(_requirement())
            checkout.write_text(str(ROOT))
        elif not checkout.exists() or checkout.read_text() != str(ROOT):  # same requirements, another checkout
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                            "-e", str(ROOT)], check=True, timeout=300)
            checkout.write_text(str(ROOT))
    return VENV / "bin"


def run_vf_eval(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``vf-eval ARGS --no-push --no-rich`` from the verifiers environment; asserts exit 0. Its
    ``bin`` goes first on ``PATH`` (the chat program is prepared with its ``uv``)."""
    bin_dir = verifiers_bin()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([str(bin_dir / "vf-eval"), *args, "--no-push", "--no-rich"], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def episodes_by_problem(run: Path) -> dict[str, dict]:
    """``traces.jsonl`` of a ``vf-eval`` run directory: each episode by its task's ``problem_id``."""
    lines = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    return {line["task"]["data"]["problem_id"]: line for line in lines}


if __name__ == "__main__":  # scripts/test.sh builds it in the background: `python tests/helpers/vf_eval.py`
    print(verifiers_bin())
