"""scripts/pytest_failures.py, what the vLLM-on-CPU check prints when a test fails: from a real
pytest run's JUnit report, each failed or errored test's node id and the first lines of its
failure (the failing statement, the ``E`` lines, where it was raised); nothing for passing tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pytest_failures.py"

FAILING = '''
import pytest

LOGP_TOLERANCE = 0.05


def test_passes():
    print("vLLM (a passing test's output)")


def test_gap_after_training():
    gap_step0, gap_trained = 0.293, 0.089
    assert gap_step0 > 4 * LOGP_TOLERANCE and gap_step0 > 5 * gap_trained


class TestServe:
    def test_same_debates(self):
        raise RuntimeError("vllm serve exited with status 1\\nsee its log")


@pytest.fixture
def engine():
    raise OSError("no tiny model at /nowhere")


def test_needs_engine(engine):
    pass
'''


def test_failures_are_named_with_their_first_lines(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_demo.py").write_text(FAILING)
    report = tmp_path / "report.xml"
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                          f"--junitxml={report}", "tests/test_demo.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 1 and report.exists(), ran.stdout[-2000:]
    done = subprocess.run([sys.executable, str(SCRIPT), str(report), "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    blocks = {}
    for line in done.stdout.splitlines():
        if not line.startswith("    "):
            blocks[line] = []
        else:
            blocks[list(blocks)[-1]].append(line.strip())
    assert list(blocks) == ["FAILED tests/test_demo.py::test_gap_after_training",
                            "FAILED tests/test_demo.py::TestServe::test_same_debates",
                            "ERROR tests/test_demo.py::test_needs_engine"]
    gap = blocks["FAILED tests/test_demo.py::test_gap_after_training"]
    assert gap[0] == "> assert gap_step0 > 4 * LOGP_TOLERANCE and gap_step0 > 5 * gap_trained"
    assert any("0.293" in line and line.startswith("E") for line in gap)
    assert gap[-1].startswith("tests/test_demo.py:") and gap[-1].endswith("AssertionError")
    serve = blocks["FAILED tests/test_demo.py::TestServe::test_same_debates"]
    assert "E       RuntimeError: vllm serve exited with status 1" in serve and "E       see its log" in serve
    assert any("OSError: no tiny model at /nowhere" in line for line in blocks["ERROR tests/test_demo.py::test_needs_engine"])
    assert "a passing test's output" not in done.stdout


def test_a_report_that_is_not_there_is_a_clear_error(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing.xml")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "cannot read" in done.stderr and done.stdout == ""
