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


@pytest.mark.slow
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


@pytest.mark.slow
def test_trainer_overhead_benchmark_runs_the_three_arms_at_the_tiny_shape(tiny_model_dir, tmp_path) -> None:
    """``benchmarks/trainer_overhead.py --shape tiny``: plain TRL, GRPO-only and both channels,
    each in its own process against one server, with matching TRL arguments; the full arm ran
    hint-distillation sites and DPO pairs (the script fails otherwise); the table and the last
    JSON line agree. The arms run at the same time (``--concurrent``, to keep the suite short),
    so its timings are not checked (they live in docs/performance.md)."""
    done = subprocess.run(
        [sys.executable, "benchmarks/trainer_overhead.py", "--shape", "tiny", "--repeats", "1", "--concurrent",
         "--tiny-model-dir", tiny_model_dir, "--work", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["benchmark"] == "trainer_overhead" and result["shape"] == "tiny" and result["steps_per_arm"] == 2
    assert result["concurrent"] is True
    check_provenance(result["provenance"], [load_problem_source(None).fingerprint()])
    arms = result["arms"]
    assert set(arms) == {"trl", "grpo", "full"}
    for figures in arms.values():
        assert figures["s_per_step"] > figures["outside_generation_s"] > 0 and figures["peak_memory_gib"] > 0.05
    for name, (a, b) in {"grpo_vs_trl": ("grpo", "trl"), "full_vs_grpo": ("full", "grpo")}.items():
        assert set(result[name]) == {"s_per_step", "outside_generation_s", "peak_memory"}
        assert result[name]["s_per_step"] == pytest.approx(arms[a]["s_per_step"] / arms[b]["s_per_step"], rel=1e-2)
        assert result[name]["peak_memory"] == pytest.approx(arms[a]["peak_memory_gib"] / arms[b]["peak_memory_gib"],
                                                            rel=1e-2)
    # the full arm's channels logged their own cost in every measured step (metrics.jsonl)
    assert arms["full"]["time/sdpo_s"] > 0 and arms["full"]["time/replay_s"] > 0
    assert "time/sdpo_s" not in arms["grpo"] and arms["grpo"]["memory/peak_gib"] > 0
    table = [line for line in lines if line.startswith(("plain TRL", "run_training"))]
    assert len(table) == 3 and any(line.startswith("grpo_vs_trl:") for line in lines)


def test_trainer_overhead_full_override_sets_the_full_arm_only(tmp_path) -> None:
    """``--full-override`` reaches the full arm's config (the channels measured at an ablation's
    chosen settings) and leaves the GRPO arm's as the preset has it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import trainer_overhead
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from trainer_client.config import parse_overrides

    spec = {"model_dir": str(tmp_path), "url": "http://127.0.0.1:1", "steps": 2, "prompts": 1, "generations": 2,
            "completion_len": 8, "seed": 0, "suppress_tokens": [],
            "full_overrides": parse_overrides(["sdpo.teacher_model_kind=base", "sdpo.failed_only=true",
                                               "replay.ref_model_sync_steps=10", "replay.pair_source=both"])}
    full, _ = trainer_overhead.train_config("full", spec, tmp_path / "full")
    grpo, _ = trainer_overhead.train_config("grpo", spec, tmp_path / "grpo")
    assert (full.sdpo.teacher_model_kind, full.sdpo.failed_only) == ("base", True)
    assert (full.replay.ref_model_sync_steps, full.replay.pair_source) == (10, "both")
    assert full.sdpo.alpha > 0 and full.replay.beta > 0 and grpo.sdpo.alpha == 0 and grpo.replay.beta == 0
    default, _ = trainer_overhead.train_config("full", {**spec, "full_overrides": {}}, tmp_path / "default")
    assert (default.sdpo.teacher_model_kind, default.replay.ref_model_sync_steps) == ("live", None)
    assert (default.replay.pair_source, default.sdpo.failed_only) == ("teachers", False)


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
