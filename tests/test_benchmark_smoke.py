"""The trainer benchmark runs where the tests run (CPU, no liger-kernel) and prints its figures.

Tiny sizes and one repeat: this checks that ``benchmarks/trainer_step.py`` works end to end and
reports every pair count it was asked for, never its timings (those live in the README).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    assert set(result["ratio_by_pairs_per_step"]) == {"2", "1"}
    assert all(ratio > 0 for ratio in result["ratio_by_pairs_per_step"].values())
    assert result["ratio"] == result["ratio_by_pairs_per_step"]["2"]
    assert result["most_pairs_within_target"] in (0, 1, 2)
    if importlib.util.find_spec("liger_kernel") is None:
        skipped = [line for line in lines if line.startswith("JSD memory part skipped")]
        assert len(skipped) == 1 and "liger-kernel is not installed" in skipped[0]
        assert "jsd_memory_ratio" not in result
    else:
        assert result["jsd_memory_ratio"] > 0
