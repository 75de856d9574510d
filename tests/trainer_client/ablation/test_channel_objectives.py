"""The channels' own objectives read off a run's metrics, on a curve computed by hand."""

from __future__ import annotations

import json

import pytest

from trainer_client.ablation.channel_objectives import channel_objectives, read_curve


def _curve() -> list[dict]:
    lines = [{"step": 0, "eval/problems": 64.0, "eval/first_answer_accuracy": 0.5}]
    for step in range(1, 7):
        line = {"step": step, "tokens/sampled": 100.0, "loss/sdpo_jsd": 0.1 * step, "sdpo/sites": 4.0,
                "sdpo/teacher_advantage": float(step - 3), "pairs/stored": 2.0 * step,
                "replay/group_pairs": 1.0, "loss/trace_replay_dpo": 0.7 - 0.01 * step}
        if step % 3 == 0:  # the held-out monitor every 3 steps
            line.update({"replay/heldout/margin_above_start": step / 10, "replay/heldout/pairs": 2.0 * step,
                         "replay/heldout/accuracy": step / 12})
        lines.append(line)
    return lines


def test_first_last_and_run_means_and_the_last_monitor_by_hand() -> None:
    out = channel_objectives(_curve(), window=2)
    assert out["tokens_sampled"] == 600.0
    sdpo, replay = out["sdpo"], out["replay"]
    assert sdpo["jsd"]["first"] == pytest.approx(0.15) and sdpo["jsd"]["last"] == pytest.approx(0.55)
    assert sdpo["teacher_advantage"]["run"] == pytest.approx((-2 - 1 + 0 + 1 + 2 + 3) / 6)
    assert replay["margin_above_start"] == pytest.approx(0.6) and replay["heldout_pairs"] == 12.0
    assert replay["heldout_accuracy"] == pytest.approx(0.5)
    assert replay["dpo_loss"]["first"] == pytest.approx(0.685) and replay["dpo_loss"]["last"] == pytest.approx(0.645)
    assert replay["pairs_stored"] == 12.0 and replay["group_pairs"] == 6.0


def test_a_run_without_channels_has_none_and_the_file_reads_back(tmp_path) -> None:
    curve = [{"step": 1, "tokens/sampled": 7.0, "loss/grpo": 0.1, "loss/sdpo_jsd": 0.0}]  # the JSD logged, off
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in curve) + "\n\n")
    assert channel_objectives(read_curve(path)) == {"tokens_sampled": 7.0, "replay": None, "sdpo": None}
    with pytest.raises(ValueError, match="window must be at least 1"):
        channel_objectives(curve, window=0)
