"""The trainer benchmark runs where the tests run (CPU, no liger-kernel) and prints its figures.

Tiny sizes and one repeat: this checks that ``benchmarks/trainer_step.py`` works end to end and
reports every pair count it was asked for, never its timings (those live in the README).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from provenance_checks import check_provenance

from env_server.debate.problems import load_problem_source

REPO = Path(__file__).resolve().parents[2]


def test_trainer_step_benchmark_reports_each_pair_count(tiny_model_dir) -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/trainer_step.py", "--repeats", "1", "--rows", "4", "--prompt-len", "16",
         "--completion-len", "48", "--hidden", "32", "--layers", "1", "--pairs-per-step", "2", "1",
         "--tiny-model-dir", tiny_model_dir, "--jsd-tokens", "64", "--jsd-vocab", "512"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["benchmark"] == "trainer_step" and result["pairs_per_step"] == 2
    check_provenance(result["provenance"])
    assert result["provenance"]["config"]["rows"] == 4
    ratios = result["ratio_by_pairs_per_step"]
    assert set(ratios) == {"2", "1"}
    # the figures agree with each other: the headline ratio is ours / baseline at the first pair
    # count, it is that count's entry, the table printed the same numbers, and the pair count
    # reported within target is the largest whose ratio is within it
    assert result["baseline"] > 0 and result["ours"] > 0
    assert result["ratio"] == pytest.approx(result["ours"] / result["baseline"], rel=2e-2, abs=2e-3)
    assert result["ratio"] == ratios["2"]
    within = [int(pairs) for pairs, ratio in ratios.items() if ratio <= result["target_ratio_max"]]
    assert result["most_pairs_within_target"] == (max(within) if within else 0)
    rows = [re.match(r"loss step, median s, (\d+) DPO pair\(s\) per step\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
            for line in lines if line.startswith("loss step, median s,")]
    table = {int(row.group(1)): float(row.group(4)) for row in rows if row}
    assert set(table) == {2, 1}
    assert all(table[pairs] == pytest.approx(ratios[str(pairs)], abs=6e-3) for pairs in table)
    if importlib.util.find_spec("liger_kernel") is None:
        skipped = [line for line in lines if line.startswith("JSD memory part skipped")]
        assert len(skipped) == 1 and "liger-kernel is not installed" in skipped[0]
        assert "jsd_memory_ratio" not in result
    else:
        assert result["jsd_memory_ratio"] > 0


def test_env_throughput_benchmark_names_its_provenance() -> None:
    """The env benchmarks' JSON carries the provenance (one short row of ``env_throughput``; the
    others add it the same way), with what the server it started says of itself."""
    done = subprocess.run(
        [sys.executable, "benchmarks/env_throughput.py", "--sessions", "2", "--seconds", "1", "--workloads", "cached",
         "--servers", "ours", "--idle-sessions", "0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"][0]["sessions"] == 2
    check_provenance(result["provenance"], [load_problem_source(None).fingerprint()])
    assert result["provenance"]["config"]["sessions"] == [2]


def test_mux_path_benchmark_plays_every_debate_and_names_its_provenance() -> None:
    """``benchmarks/mux_path.py`` at tiny sizes: its figure counts only fully played, graded debates
    (the child fails otherwise), one run per tree, the ratio against the first tree."""
    done = subprocess.run(
        [sys.executable, "benchmarks/mux_path.py", "--sessions", "8", "--connections", "2", "--rounds", "2",
         "--repeats", "1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (tree,) = result["us_per_step"]
    assert result["us_per_step"][tree] > 0 and result["ratio"][tree] == 1.0 and len(result["runs"][tree]) == 1
    assert result["provenance"]["config"]["sessions"] == 8
