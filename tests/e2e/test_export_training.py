"""Exports a trainer can use: a real ``mathdebate ablate`` (one arm with trace replay and two
oracle teachers, one seed, one step) against a real server that writes a trajectory log, then
``mathdebate export`` of both, then ONE step of TRL's own ``SFTTrainer`` on the SFT export and
ONE step of TRL's own ``DPOTrainer`` on the pairs export, each on the tiny model, each given
the exported dataset as loaded (extra columns and all)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import datasets
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from env_server.cli import running_server
from trainer_client.cli import main
from trainer_client.export.command import export_datasets
from trainer_client.export.errors import MalformedLineError
from trainer_client.trl_compat import checkpointing_off


@pytest.fixture(scope="module")
def exported(tiny_learning_dir, tmp_path_factory) -> dict[str, Any]:
    """A real ablation run (tiny settings, the tiny-learning model) and its server's trajectory
    log, exported together (``--format disk``)."""
    root = tmp_path_factory.mktemp("export-training")
    ablation, log = root / "ablate", root / "trajectories.jsonl"
    ablation.mkdir()
    (ablation / "tiny-learning").symlink_to(tiny_learning_dir)  # the build ablate would make, reused
    serve = ["--grading-workers", "1", "--problems", "gen:single_digit_sum", "--trajectory-log", str(log)]
    with running_server(serve) as url:
        assert main(["ablate", "--arms", "replay", "--seeds", "1", "--max-steps", "1", "--heldout", "1", "--pass-k", "0",
                     "--eval-problems", "2",
                     "--no-controls", "--env-url", url, "--model", "tiny-learning", "--output-dir", str(ablation),
                     "-o", "replay.teachers=[{name: oracle-a, kind: oracle}, {name: oracle-b, kind: oracle}]"]) == 0
    # ablate's default evaluation during training (a tenth of the steps apart, at least every step)
    from trainer_client.training.reporting import read_eval_metrics

    curve = read_eval_metrics(ablation / "runs" / "replay" / "seed0" / "metrics.jsonl")
    assert [(line["step"], line["eval/problems"]) for line in curve] == [(0, 2), (1, 2)]
    out = root / "export"
    assert main(["export", str(log), str(ablation), "--output-dir", str(out)]) == 0
    return {"out": out, "log": log, "ablation": ablation}


def _config(cls, out: Path):
    return cls(output_dir=str(out), max_steps=1, per_device_train_batch_size=4, max_length=256, use_cpu=True,
               report_to=[], save_strategy="no", logging_steps=1, **checkpointing_off(cls))


def test_an_ablation_and_its_servers_log_export_with_the_runs_gold_label(exported):
    pairs_file = exported["ablation"] / "runs" / "replay" / "seed0" / "replay_pairs.jsonl"
    stored = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    pairs = datasets.load_from_disk(str(exported["out"] / "pairs"))
    assert len(pairs) == len(stored) > 0
    assert [row["chosen"][0]["content"] for row in pairs] == [p["chosen"] for p in stored]
    assert [row["prompt"] for row in pairs] == [p["prompt_messages"] for p in stored]
    assert set(pairs["run"]) == {"runs/replay/seed0"} and set(pairs["run_gold_supervised"]) == {True}
    episodes = datasets.load_from_disk(str(exported["out"] / "episodes"))
    assert len(episodes) == len(exported["log"].read_text().splitlines())  # the training's episodes, graded
    card = (exported["out"] / "README.md").read_text()
    assert f"`{exported['ablation']}` (ablate)" in card and f"`{exported['log']}` (trajectory log)" in card
    assert f"{len(stored)} of {len(stored)} rows gold-supervised; from runs labelled gold-supervised (oracle teachers): " \
           "`runs/replay/seed0`" in card


def test_a_run_directory_and_a_pair_file_alone_export_their_pairs(exported, tmp_path):
    run = exported["ablation"] / "runs" / "replay" / "seed0"
    report = export_datasets([run], tmp_path / "run")
    assert report.rows == {"pairs": len((run / "replay_pairs.jsonl").read_text().splitlines())}
    assert report.sources[0].source.kind == "run"
    alone = export_datasets([run / "replay_pairs.jsonl"], tmp_path / "alone", fmt="parquet")
    assert alone.sources[0].source.kind == "pairs"
    pairs = datasets.load_dataset("parquet", data_files=str(tmp_path / "alone" / "pairs.parquet"), split="train")
    assert set(pairs["run"]) == {None} and set(pairs["run_gold_supervised"]) == {None}  # a file alone names no run
    assert all(pairs["gold_supervised"])  # the pairs' own label: oracle teachers in the majority
    lines = (run / "replay_pairs.jsonl").read_text().splitlines()
    torn = tmp_path / "torn_pairs.jsonl"
    torn.write_text("\n".join([*lines[:-1], lines[-1][:40]]) + "\n")
    with pytest.raises(MalformedLineError, match=f"line {len(lines)}: not a replay pair"):
        export_datasets([torn], tmp_path / "torn")


def test_one_sft_step_of_trl_on_the_sft_export(exported, tiny_model_dir, tmp_path):
    sft = datasets.load_from_disk(str(exported["out"] / "sft"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = next(model.parameters()).detach().clone()
    trainer = SFTTrainer(model=model, args=_config(SFTConfig, tmp_path), train_dataset=sft,
                         processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(trainer.state.log_history[0]["loss"]) and trainer.state.log_history[0]["num_tokens"] > 0
    assert not next(model.parameters()).detach().equal(before)  # the step moved the weights


def test_one_dpo_step_of_trl_on_the_pairs_export(exported, tiny_model_dir, tmp_path):
    pairs = datasets.load_from_disk(str(exported["out"] / "pairs"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = next(model.parameters()).detach().clone()
    trainer = DPOTrainer(model=model, args=_config(DPOConfig, tmp_path), train_dataset=pairs,
                         processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    assert trainer.state.global_step == 1
    first = trainer.state.log_history[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-3)  # step 0: policy == reference, loss = -log σ(0)
    assert math.isfinite(first["logps/chosen"]) and math.isfinite(first["logps/rejected"])
    assert not next(model.parameters()).detach().equal(before)
