"""The main job as a user reads it: ``mathdebate demo`` (a real server, scripted debates, then
the demo's training on the tiny-learning model against a second real server, 2 steps here, and
the held-out evaluation) with every warning recorded (``simplefilter("always")``).

transformers 5.24 + trl 1.16 still print one FutureWarning, TRL's: trl 1.16.0 (the newest
release) reads ``model.is_gradient_checkpointing`` in ``trl/models/utils.py``
(``_unwrap_model_for_generation``, each generation; ``disable_gradient_checkpointing``, each
scored batch), a property transformers 5.23 made a deprecated alias that warns on every read
(``modeling_utils.py``, no stacklevel). It is not ours to remove, so this asserts what is ours:
no FutureWarning or DeprecationWarning raised from a file of ``env_server`` or
``trainer_client``. (Warnings of the server subprocesses are not seen here.)"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import env_server
import trainer_client
from trainer_client.cli import main
from trainer_client.training.reporting import read_eval_metrics, read_metrics

OURS = (Path(env_server.__file__).resolve().parent, Path(trainer_client.__file__).resolve().parent)


def _ours(filename: str) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(package) for package in OURS)


@pytest.mark.slow
def test_the_demo_shows_no_weight_bars_and_our_code_raises_no_deprecation(tmp_path, capfd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["demo", "--episodes", "4", "--train-steps", "2", "--heldout", "2",
                     "--output-dir", str(tmp_path / "demo")])
    assert code == 0
    ours = [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning)) and _ours(w.filename)]
    assert ours == []
    printed = capfd.readouterr()
    shown = printed.out + printed.err
    # transformers' per-call bars of each model load and save (weight_bars_off), under the training bar and around it
    assert "Loading weights" not in shown and "Writing model shards" not in shown
    assert "held-out first-answer accuracy on 2 problems unseen in training: greedy" in printed.out
    assert "sampled (avg@8, temperature 0.7)" in printed.out and "tiny-sums model" in printed.out
    metrics = read_metrics(tmp_path / "demo" / "metrics.jsonl")  # its step lines (the start line is an event)
    assert [m["step"] for m in metrics] == [1, 2]
    # the evaluation during training on 64 validation problems (every 10 steps: here before and after the 2)
    curve = read_eval_metrics(tmp_path / "demo" / "metrics.jsonl")
    assert [(m["step"], m["eval/problems"]) for m in curve] == [(0, 64), (2, 64)]
    assert "greedy first-answer accuracy on 64 validation problems (step: accuracy): 0: " in printed.out
    assert (tmp_path / "demo" / "final" / "model.safetensors").exists()
