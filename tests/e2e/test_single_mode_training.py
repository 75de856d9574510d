"""Training in single mode (RFC 0006, the single-agent baseline): ``mathdebate train`` with
``mode: single`` against a real server, and the reward-to-loss path on single-answer records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from env_server.protocol.markers import ErrorKind, Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward
from trainer_client.credit.pipeline import batch_advantages
from trainer_client.credit.role_samples import build_role_samples, shape_samples, turn_values
from trainer_client.credit.shaping import available_strategies, get_strategy
from trainer_client.rollout.segments import Segment, SegmentOwner
from trainer_client.training.reporting import read_metrics

REPO = Path(__file__).resolve().parents[2]


def single_record(episode_id: str, correct: bool) -> EpisodeRewards:
    """A graded single-mode record as the server writes it (RFC 0006's example): one solver turn,
    ``verifier_accepted`` and ``judge_correct`` null, ``rounds`` 0, per-role facts for the solver."""
    turn = TurnReward(t=0, role=Role.SOLVER, reward=float(correct), correct=correct, answer="1" if correct else "2",
                      error_kind=None if correct else ErrorKind.WRONG_ANSWER)
    facts = CounterfactualFacts(first_answer_correct=correct, last_solver_answer_correct=correct,
                                final_answer_correct=correct, judge_correct=None, verifier_accepted=None, rounds=0,
                                local_rewards={Role.SOLVER: float(correct)}, rewards_without_role={Role.SOLVER: 0.0})
    return EpisodeRewards(episode_id=episode_id, problem_id="gen/single_digit_sum/1", turns=[turn],
                          episode_reward=float(correct), facts=facts, graded_at=0.0)


BUILT_IN_STRATEGIES = ("identity", "potential_based", "difference_rewards", "coma_advantage", "reward_mixing")


@pytest.mark.parametrize("strategy", BUILT_IN_STRATEGIES)
def test_every_shaping_strategy_shapes_single_answer_batches(strategy) -> None:
    """Every built-in strategy runs on a batch of single-mode records without falling back: the
    solver samples only. Those that need a verifier's turn (COMA's verdict counterfactual) or a
    counterfactual without it (difference rewards, reward mixing: the solver's local reward is
    the episode reward) give the solver what ``identity`` gives it."""
    assert set(BUILT_IN_STRATEGIES) <= set(available_strategies())
    records = [single_record(f"e{k}", correct) for k, correct in enumerate([True, False, False, True])]
    samples = build_role_samples(records, [0, 0, 1, 1])
    assert samples.roles == (Role.SOLVER,) * 4 and samples.turn_roles == ((Role.SOLVER,),) * 4
    shaped = get_strategy(strategy).shape(samples.batch)
    values = shape_samples(get_strategy(strategy), samples)
    assert values.shape == (4,) and np.all(np.isfinite(values))
    if isinstance(shaped, dict):
        assert set(shaped) == {Role.SOLVER}
    if strategy in ("identity", "difference_rewards", "reward_mixing"):
        np.testing.assert_allclose(values, [1.0, 0.0, 0.0, 1.0])
    if strategy == "coma_advantage":  # the group mean: GRPO's baseline, i.e. identity after normalisation
        np.testing.assert_allclose(values, [0.5, -0.5, -0.5, 0.5])
    assert [v.tolist() for v in turn_values(samples, values)] == [[v] for v in values.tolist()]


def test_batch_advantages_on_single_answer_rollouts() -> None:
    """The trainer's whole reward-to-loss path on single-mode rollouts: each completion is one
    solver segment; the solver's group-normalised advantage covers it, nothing else is trained."""
    records = [single_record(f"e{k}", correct) for k, correct in enumerate([True, False, True, True])]
    # the solver's tool call (tokens 0-5), then the tool's "debate is over" and the closing text (no owner)
    segments = [[Segment(0, 6, SegmentOwner(t=0, role=Role.SOLVER, produced=True)), Segment(6, 8, None)]
                for _ in records]
    result = batch_advantages(records, 4, get_strategy("coma_advantage"), segments, 8, 0,
                              verifier_accept_probs=[None] * 4)
    advantages = result.advantages[:, 0].numpy()
    assert advantages[0] > 0 > advantages[1] and advantages[0] == pytest.approx(advantages[2])
    assert result.loss_mask[:, :6].all() and not result.loss_mask[:, 6:].any()
    assert "debate/reward/verifier" not in result.metrics


def test_mathdebate_train_in_single_mode(tiny_model_dir, tmp_path) -> None:
    """``mathdebate train`` with ``mode: single`` in its YAML config, for 2 steps on the default
    tiny model against a real server on a real socket, with COMA shaping (a strategy that reads
    the verifier's verdict): every episode the server grades is one solver turn (its own
    trajectory log says so), the metrics are written, and shaping never falls back."""
    from env_server.cli import running_server

    config = yaml.safe_load((REPO / "configs" / "cpu_demo.yaml").read_text())
    config.update(mode="single", model=tiny_model_dir, output_dir=str(tmp_path / "out"), max_steps=2,
                  reward_shaping={"strategy": "coma_advantage"})
    config_path = tmp_path / "single.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "trajectories.jsonl"
    with running_server(["--grading-workers", "1", "--trajectory-log", str(log_path)]) as url:
        done = subprocess.run([sys.executable, "-m", "trainer_client.cli", "train", "--config", str(config_path),
                               "--preset", "baseline", "--env-url", url], cwd=REPO, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reward shaping: coma_advantage" in done.stderr  # the strategy was active (start-up INFO line)
    assert "failed on a batch" not in done.stderr  # and no batch fell back to the raw rewards

    out = tmp_path / "out"
    lines = read_metrics(out / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    assert all("debate/reward/solver" in line and "debate/reward/verifier" not in line for line in lines)
    assert yaml.safe_load((out / "config.yaml").read_text())["mode"] == "single"
    assert (out / "final").is_dir()

    episodes = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(episodes) >= 8  # 2 steps x 4 rollouts (more if a rollout's episode was replaced)
    for episode in episodes:
        assert [turn["role"] for turn in episode["turns"]] == ["solver"]
        facts = episode["rewards"]["facts"]
        assert facts["rounds"] == 0 and facts["verifier_accepted"] is None and facts["judge_correct"] is None
        assert set(facts["local_rewards"]) == {"solver"}
