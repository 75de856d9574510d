"""Data-parallel training: ``mathdebate train`` under ``torchrun`` with two CPU processes (gloo),
against a live env server. The same launch runs on GPUs (``torchrun``/``accelerate launch``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_client.training.reporting import read_metrics

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_processes_train_together_and_keep_their_own_files(server_url, tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "run"
    # `--model tiny` builds under the output directory's parent unless an up-to-date build is
    # there: reuse the suite's; two oracle teachers (the default teachers would be built first)
    (tmp_path / "tiny-model").symlink_to(tiny_model_dir, target_is_directory=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "trainer_client.cli", "train", "--preset", "full", "--model", "tiny", "--env-url", server_url,
               "--max-steps", "2", "--output-dir", str(out), "-o", "logging_steps=1",
               "-o", "replay.teachers=[{name: oracle-a, kind: oracle}, {name: oracle-b, kind: oracle}]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    # one process writes the run's shared files and prints the summary once
    assert done.stdout.count("metrics: ") == 1, done.stdout
    lines = read_metrics(out / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    assert (out / "config.yaml").exists() and (out / "training.png").exists() and (out / "final").is_dir()
    # both processes trained: each kept the replay pairs of its own rollouts in its own file
    # (the tiny model starts with wrong answers, so step 1 already gives every process pairs)
    assert not (out / "replay_pairs.jsonl").exists()
    for rank in (0, 1):
        rows = [json.loads(line) for line in (out / f"replay_pairs.rank{rank}.jsonl").read_text().splitlines()]
        assert rows and all(row["context_ids"] and row["chosen_ids"] and row["rejected_ids"] for row in rows)
    # and the processes played different episodes (each rank gets its own prompts and seeds), so
    # they drew different pairs: a DPO forward through the DDP wrapper would have hung them here
    episodes = [{json.loads(line)["episode_id"] for line in (out / f"replay_pairs.rank{rank}.jsonl").open()}
                for rank in (0, 1)]
    assert not episodes[0] & episodes[1]
