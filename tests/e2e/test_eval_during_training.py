"""Evaluation during training (``eval_steps``) against a real server with real TRL: the demo's
recipe (``tiny-sums``, GRPO, rewards that move the weights) trained twice for the same steps, once
without and once with an evaluation every step on validation problems.

What must hold: the trained weights are bit-identical either way (the evaluation restores every
generator the training draws from; a version that drew one more number from torch's generator
was measured to change them), the evaluation measures what it says (its step-0 figures are those
of the starting model, its last those of ``final/``, each recomputed here through
``evaluate_policy`` on the same validation problems), and its figures go through TRL's logging to
every callback (what ``report_to`` integrations are) and into ``metrics.jsonl`` without changing
the training lines. Resuming after a kill -9 without logging an evaluation twice is tested in
``test_resume.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from env_server.cli import running_server
from env_server.debate.problems import load_problem_source
from env_server.debate.problems.splits import split_of_seed
from trainer_client.cli import DEMO_TRAIN_PROBLEMS, demo_config
from trainer_client.evaluation.during_training import ValidationEvaluation, validation_seeds
from trainer_client.evaluation.policy_eval import evaluate_policy
from trainer_client.model.fingerprint import weights_fingerprint
from trainer_client.tiny_models.build import tiny_model_path
from trainer_client.training.reporting import read_eval_metrics, read_metrics
from trainer_client.training.train import run_training

STEPS = 2
#: What each evaluation measures here (small: the figures are compared, not interpreted).
EVAL = {"eval.problems": 12, "eval.k": 2, "eval.debate_k": 1}


class _Logs(TrainerCallback):
    """Every log dict the trainer hands its callbacks (as it hands them to report_to's integrations)."""

    def __init__(self) -> None:
        self.logs: list[tuple[int, dict]] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        self.logs.append((state.global_step, dict(logs or {})))


def _config(out: Path, url: str, eval_steps: int):
    from trainer_client.config import load_config

    base = demo_config(str(out), url, STEPS).model_dump(mode="json")
    return load_config(None, None, {**{k: v for k, v in base.items() if not k.startswith("eval")},
                                    "eval_steps": eval_steps, **EVAL, "report_to": []})


def _figures(model_dir: Path | str, config) -> dict[str, float]:
    """The evaluation's figures of a saved model, recomputed through ``evaluate_policy``."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    return ValidationEvaluation.from_config(config)(model, tokenizer)


@pytest.mark.slow
def test_evaluation_during_training_measures_the_policy_and_leaves_training_bit_identical(tmp_path) -> None:
    with running_server(["--grading-workers", "1", "--problems", DEMO_TRAIN_PROBLEMS]) as url:
        off = run_training(_config(tmp_path / "off", url, 0), progress=False)
        logs = _Logs()
        config = _config(tmp_path / "on", url, 1)
        on = run_training(config, progress=False, callbacks=[logs])

    # the training: bit-identical weights, and they did move from the start
    start = tiny_model_path(config.model, tmp_path)
    fingerprints = [weights_fingerprint(AutoModelForCausalLM.from_pretrained(path))
                    for path in (off / "final", on / "final", start)]
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]
    assert [line["step"] for line in read_metrics(off / "metrics.jsonl")] == list(range(1, STEPS + 1))
    _same_but_timings(read_metrics(on / "metrics.jsonl"), read_metrics(off / "metrics.jsonl"))
    assert read_eval_metrics(off / "metrics.jsonl") == []

    # the evaluation: before the first step and after each, on validation problems only
    evaluations = read_eval_metrics(on / "metrics.jsonl")
    assert [line["step"] for line in evaluations] == list(range(STEPS + 1))
    assert all(split_of_seed(seed) == "validation" for seed in validation_seeds(EVAL["eval.problems"]))
    for line in evaluations:
        assert {"eval/first_answer_accuracy", "eval/sampled_accuracy", "eval/pass_at_k", "eval/final_accuracy",
                "eval/sampled_final_accuracy", "eval/valid_rate", "eval/seconds"} <= set(line)
        assert line["eval/problems"] == EVAL["eval.problems"]
    # it measures the policy it says: the starting model at step 0, the trained one at the end
    figures = {0: _figures(start, config), STEPS: _figures(on / "final", config)}
    for step, expected in figures.items():
        [got] = [line for line in evaluations if line["step"] == step]
        for key, value in expected.items():
            if key != "eval/seconds":
                assert got[key] == value, (step, key)
    # the same figures as evaluate_policy's own, on those problems
    model = AutoModelForCausalLM.from_pretrained(start)
    direct = evaluate_policy(model, AutoTokenizer.from_pretrained(start), load_problem_source(config.problems),
                             validation_seeds(EVAL["eval.problems"]), k=2, debate_k=1, temperature=config.temperature,
                             max_rounds=1, max_new_tokens=config.max_completion_length).figures
    assert evaluations[0]["eval/first_answer_accuracy"] == direct["accuracy"]
    assert evaluations[0]["eval/final_accuracy"] == direct["final_accuracy"]
    # through TRL's logging: every callback (report_to's integrations are callbacks) got each evaluation
    logged = [(step, entry) for step, entry in logs.logs if any(key.startswith("eval/") for key in entry)]
    assert [step for step, _ in logged] == list(range(STEPS + 1))
    for (_, entry), line in zip(logged, evaluations, strict=True):
        assert {k: v for k, v in entry.items() if k.startswith("eval/")} == \
            {k: v for k, v in line.items() if k.startswith("eval/")}
        assert not any(key.startswith(("loss", "debate/")) for key in entry)  # the training lines stay whole
    assert (on / "training.png").stat().st_size > 0


#: Metrics that depend on the clock or the process, not on the training.
_TIMING = ("time", "per_second", "memory/")


def _same_but_timings(got: list[dict], expected: list[dict]) -> None:
    """Two runs' training lines agree on every metric that is not a timing."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        keys = {key for key in b if not any(word in key for word in _TIMING)}
        assert keys == {key for key in a if not any(word in key for word in _TIMING)}
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
