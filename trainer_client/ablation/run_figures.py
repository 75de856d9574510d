"""Figures of an ablation that need no training: the answer-only controls on the held-out
problems, and a run's trace-replay figures read from its logged metrics."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["RUN_METRICS", "replay_figures", "run_means", "static_controls"]

#: Metrics averaged over a run's steps for the report.
RUN_METRICS = ("debate/reward/solver", "debate/reward/verifier", "debate/judge_accuracy", "debate/episode_reward",
               "debate/error_site_rate", "step_time")


def _numbers(text: str) -> list[str]:
    return re.findall(r"-?\d+(?:\.\d+)?", text)


def static_controls(golds: Sequence[str], problems: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The answer-only controls on the held-out problems.

    Args:
        golds: each problem's reference answer.
        problems: each problem's text.

    Returns:
        ``{"best constant": {"accuracy", "answer"}, "copy from prompt": {"accuracy", "which"}}``;
        correctness through the server's grader.
    """
    from collections import Counter

    from trainer_client.evaluation.heldout import grade_answer_text

    candidates = [a for a, _ in Counter(golds).most_common(5)]
    best = max(((sum(grade_answer_text(g, c) for g in golds) / len(golds), c) for c in candidates),
               key=lambda x: x[0])
    copies = {}
    for which, pick in (("first", 0), ("last", -1)):
        hits = [bool(nums) and grade_answer_text(g, nums[pick]) for g, nums in
                zip(golds, (_numbers(p) for p in problems), strict=True)]
        copies[which] = sum(hits) / len(golds)
    which = max(copies, key=lambda k: copies[k])
    return {"best constant": {"accuracy": best[0], "answer": best[1]},
            "copy from prompt": {"accuracy": copies[which], "which": f"{which} number"}}


def replay_figures(curve: list[dict[str, float]]) -> dict[str, Any]:
    """A run's trace-replay figures from its logged metrics (the last value of each running
    total): ``teacher_accuracy`` per teacher (solver and judge steps it answered, graded
    against the reference only to measure), ``agreement`` (share of replays where two teachers
    agreed), ``pair_precision`` (share of chosen sides whose answer is right), ``pairs_emitted``,
    ``pairs_per_step``, and the held-out pairs' last ``heldout_pair_accuracy`` and log-probs.
    Empty when the run logged no teacher counters."""
    last: dict[str, float] = {}
    for line in curve:
        last.update({k: v for k, v in line.items() if k.startswith(("teachers/", "pairs/", "replay/"))})
    if not any(k.startswith("teachers/") for k in last):
        return {}
    teachers = {k.split("/")[1]: v for k, v in last.items() if k.startswith("teachers/") and k.endswith("/accuracy")}
    steps = max(1, len(curve))
    return {"teacher_accuracy": teachers, "agreement": last.get("teachers/agreement"),
            "pair_precision": last.get("pairs/precision"), "pairs_emitted": last.get("pairs/emitted", 0.0),
            "pairs_per_step": last.get("pairs/emitted", 0.0) / steps,
            "heldout_pair_accuracy": last.get("replay/heldout/accuracy"),
            "heldout_chosen_logp": last.get("replay/heldout/chosen_logp"),
            "heldout_rejected_logp": last.get("replay/heldout/rejected_logp")}


def run_means(curve: list[dict[str, float]]) -> dict[str, float]:
    """Each of :data:`RUN_METRICS` averaged over the logged steps of ``curve`` (a run's
    ``metrics.jsonl`` step lines) that have it; a metric no step logged is left out."""
    out = {}
    for key in RUN_METRICS:
        values = [line[key] for line in curve if key in line]
        if values:
            out[key] = sum(values) / len(values)
    return out
