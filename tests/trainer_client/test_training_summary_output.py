"""The training summary that ``mathdebate demo`` and ``mathdebate train`` print, read as a log:
stdout is a pipe (as under CI or ``| tee``), and every cell of the table must come through whole
(it was cut at 80 columns: ``grpo`` values shown as ``-0.00…``, the ``r verifier`` header as
``verif…``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from trainer_client.cli import _print_training_summary

COLUMNS = {"grpo": "loss/grpo", "sdpo": "loss/sdpo_jsd", "replay": "loss/trace_replay_dpo", "total": "loss/total",
           "r solver": "debate/reward/solver", "r verifier": "debate/reward/verifier",
           "err sites": "debate/error_site_rate", "pairs": "pairs/stored"}


def _metrics(tmp_path, steps: int = 24):
    """A ``metrics.jsonl`` with a start event and ``steps`` step lines whose values print as wide
    as the demo's do (small negative GRPO losses, three significant digits)."""
    lines = [{"event": "start", "provenance": {}}]
    for step in range(1, steps + 1):
        lines.append({"step": step, "loss/grpo": -0.000123 * step, "loss/sdpo_jsd": 0.0789 / step,
                      "loss/trace_replay_dpo": 0.646 if step > 1 else 0.0, "loss/total": -0.000512 * step,
                      "debate/reward/solver": 0.21 + 0.007 * step, "debate/reward/verifier": 0.563,
                      "debate/error_site_rate": 0.438, "pairs/stored": 2 * step})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines[1:]


def test_the_training_table_piped_to_a_file_keeps_every_cell_whole(tmp_path):
    steps = _metrics(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # rich's width for a pipe: 80
    done = subprocess.run([sys.executable, "-c", "import sys, pathlib\nfrom trainer_client.cli import _print_training_summary\n"
                           "_print_training_summary(pathlib.Path(sys.argv[1]))", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    out = done.stdout
    assert "…" not in out
    for header in ("step", *COLUMNS):
        assert header in out
    shown = [line for line in out.splitlines() if line.startswith("│")]
    assert len(shown) == 13  # about a dozen rows: every second step of 24 (1, 3, ..., 23) and the last
    last = [cell.strip() for cell in shown[-1].strip("│").split("│")]
    assert last == [str(steps[-1]["step"]), *(f"{steps[-1][key]:.3g}" for key in COLUMNS.values())]
    assert "solver reward, mean of the first" in out


def test_the_summary_printer_reads_only_step_lines(tmp_path, capsys):
    steps = _metrics(tmp_path, steps=3)
    _print_training_summary(tmp_path)
    out = capsys.readouterr().out
    assert f"training: {len(steps)} steps" in out and "…" not in out
