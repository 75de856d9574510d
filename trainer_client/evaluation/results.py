"""Aggregates of an evaluation run: ``results.json``, ``trajectories.jsonl`` and the table.

Only scored problems count (``docs/failures.md``): a problem with a failed episode (a model
request that failed for good, or an episode the env server could not finish) is left out of
every accuracy and counted under ``failed_problems``; a request that failed is never a wrong
answer. ``results.json`` (one object):

- ``accuracy``: share of scored problems whose chosen episode is right (``episode_reward ==
  1``; ``null`` when no problem was scored); ``accuracy_ci95``: its 95% Wilson score interval
  over the scored problems (``scipy.stats.binomtest``);
- ``n_problems``, ``scored_problems``, ``failed_problems``; ``episodes``, ``episodes_scored``,
  ``episodes_failed``; ``failures``: ``reasons`` (failed episodes per typed reason, each with
  one example message: the server's own), ``requests`` and ``env`` (the run's model requests
  and its episodes on the env server: ``requests``, ``failed``, ``share``, ``reasons``);
  ``forfeits``: the model's own forfeits by kind (``blank``, ``invalid_tool_call``,
  ``rejected``: scored by the environment's rules);
- ``mode``, ``strategy``, ``n``, ``temperature``, ``select``, ``policies`` (spec per role);
- ``first_answer_accuracy`` (the chosen episode's first solver answer), ``judge_accuracy``
  (among chosen debates whose judge boxed an answer; ``null`` in single mode), ``pass_at_n``
  and ``sample_accuracy`` (all episodes of scored problems) for N > 1, ``mean_votes`` for
  self-consistency;
- ``per_role``: per role, ``reward`` (mean per-turn reward over the chosen episodes' turns) and
  ``turns``; ``error_kinds`` (markers over the chosen episodes' turns); ``mean_turns``;
- ``tokens`` and ``requests`` per policy (prompt/completion tokens, requests, failed, cost in the
  currency of ``--cost-per-million``), ``requests_failed``, ``actions_rejected``,
  ``scoring_episodes``, ``seconds``;
- ``provenance``: the commit, library versions, the command's arguments and their hash, the
  env server and its problem source, the machine (:mod:`env_server.provenance`).

``trajectories.jsonl``: one line per played episode, in the server's ``--trajectory-log`` line
schema (``episode_id``, ``problem_id``, ``turns`` with ``t``/``role``/``round``/``content``,
``rewards``: the record, ``null`` for a failed episode) plus ``problem``, ``gold``, ``mode``,
``strategy``, ``sample``, ``chosen``, ``score``/``score_source``, ``failure`` (kind, message,
status) and, per turn, ``policy``, ``messages`` (what the policy was given), ``generated`` (its
raw output when that differs from the action), token counts, ``accept_prob`` and ``forfeit``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.evaluation.policies import Policy
from trainer_client.evaluation.runner import EvalSettings, EvalTotals, PlayedEpisode, ProblemResult

__all__ = ["failure_headline", "print_table", "summarise", "trajectory_line", "wilson_interval", "write_outputs"]


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (``scipy.stats.binomtest``);
    ``(0, 1)`` when ``n == 0``."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(results: Sequence[ProblemResult], settings: EvalSettings, policies: dict[Role, Policy],
              totals: EvalTotals, seconds: float, cost_per_million: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    """The ``results.json`` object (see the module docstring)."""
    scored = [r for r in results if r.scored]
    n = len(scored)
    chosen = [r.chosen_episode for r in scored]
    correct = sum(r.correct for r in scored)
    low, high = wilson_interval(correct, n)
    records = [e.record for e in chosen if e.record is not None]
    judged = [rec.facts.judge_correct for rec in records if rec.facts.judge_correct is not None]
    role_rewards: dict[str, list[float]] = {role.value: [] for role in Role}
    error_kinds: Counter[str] = Counter()
    for record in records:
        for turn in record.turns:
            role_rewards[turn.role.value].append(turn.reward)
            if turn.error_kind is not None:
                error_kinds[turn.error_kind.value] += 1
    all_episodes = [e for r in results for e in r.episodes]
    scored_episodes = [e for r in scored for e in r.episodes]
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for episode in all_episodes:
        if episode.failure is not None:
            reasons[episode.failure.kind] += 1
            examples.setdefault(episode.failure.kind, episode.failure.message)
    per_policy: dict[str, dict[str, Any]] = {}
    for policy in {id(p): p for p in policies.values()}.values():
        c = policy.counters
        cost = (c["prompt_tokens"] * cost_per_million[0] + c["completion_tokens"] * cost_per_million[1]) / 1e6
        per_policy[policy.spec] = {"requests": c["requests"], "failed": c["failed"],
                                   "prompt_tokens": c["prompt_tokens"], "completion_tokens": c["completion_tokens"],
                                   "cost": round(cost, 6)}
    counters = totals.counters
    summary: dict[str, Any] = {
        "accuracy": correct / n if n else None,
        "accuracy_ci95": [low, high],
        "n_problems": len(results),
        "scored_problems": n,
        "failed_problems": len(results) - n,
        "mode": settings.mode,
        "strategy": settings.strategy,
        "n": 1 if settings.strategy == "greedy" else settings.n,
        "temperature": settings.temperature,
        "select": settings.select if settings.strategy == "best_of_n" else None,
        "policies": {role.value: policy.spec for role, policy in policies.items()},
        "first_answer_accuracy": _mean([float(rec.facts.first_answer_correct) for rec in records]),
        "judge_accuracy": _mean([float(j) for j in judged]),
        "pass_at_n": _mean([float(r.pass_at_n) for r in scored]) if settings.strategy != "greedy" else None,
        "sample_accuracy": _mean([float(e.correct) for e in scored_episodes]) if settings.strategy != "greedy" else None,
        "mean_votes": (_mean([float(r.votes or 0) for r in scored]) if settings.strategy == "self_consistency"
                       else None),
        "per_role": {role: {"reward": _mean(values), "turns": len(values)} for role, values in role_rewards.items()
                     if values},
        "error_kinds": dict(error_kinds),
        "mean_turns": _mean([float(len(e.turns)) for e in chosen]),
        "tokens": {spec: {k: v for k, v in c.items() if k.endswith("tokens")} for spec, c in per_policy.items()},
        "requests": per_policy,
        "episodes": len(all_episodes),
        "episodes_scored": sum(e.scored for e in all_episodes),
        "episodes_failed": sum(e.failure is not None for e in all_episodes),
        "failures": {"reasons": {kind: {"count": count, "example": examples[kind]}
                                 for kind, count in reasons.most_common()},
                     "requests": totals.requests.summary(), "env": totals.env.summary()},
        "forfeits": dict(totals.forfeits),
        "requests_failed": counters.get("requests_failed", 0),
        "actions_rejected": counters.get("actions_rejected", 0),
        "scoring_episodes": counters.get("scoring_episodes", 0),
        "seconds": round(seconds, 2),
    }
    return summary


def failure_headline(summary: dict[str, Any]) -> str | None:
    """The line ``eval`` prints first when any episode failed: how many and why (each reason
    with its count and the first message, the server's own); ``None`` when none failed."""
    failed = summary["episodes_failed"]
    if not failed:
        return None
    reasons = "; ".join(f'{kind} x{v["count"]}' + (f' ("{v["example"]}")' if v["example"] else "")
                        for kind, v in summary["failures"]["reasons"].items())
    return (f"FAILED: {failed} of {summary['episodes']} episodes failed and are not scored "
            f"({summary['failed_problems']} of {summary['n_problems']} problems left out of every accuracy): "
            f"{reasons}")


def trajectory_line(result: ProblemResult, episode: PlayedEpisode, settings: EvalSettings) -> dict[str, Any]:
    """One ``trajectories.jsonl`` object (see the module docstring)."""
    return {
        "episode_id": episode.episode_id,
        "problem_id": result.problem.problem_id,
        "turns": [{"t": t.t, "role": t.role.value, "round": t.round, "content": t.content, "policy": t.policy,
                   "messages": t.reply.messages, "generated": t.reply.generated,
                   "prompt_tokens": t.reply.prompt_tokens, "completion_tokens": t.reply.completion_tokens,
                   "accept_prob": t.reply.accept_prob, "forfeit": t.forfeit,
                   "error": t.error or t.reply.error} for t in episode.turns],
        "rewards": None if episode.record is None else episode.record.model_dump(mode="json"),
        "problem": result.problem.problem,
        "gold": result.problem.answer,
        "mode": settings.mode,
        "strategy": settings.strategy,
        "sample": episode.sample,
        "chosen": episode is result.chosen_episode,
        "score": episode.score,
        "score_source": episode.score_source,
        "error": episode.failure.describe() if episode.failure is not None else None,
        "failure": episode.failure.to_json() if episode.failure is not None else None,
    }


def write_outputs(output_dir: Path, summary: dict[str, Any], results: Sequence[ProblemResult],
                  settings: EvalSettings) -> None:
    """Write ``results.json`` and ``trajectories.jsonl`` into ``output_dir`` (created)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    with (output_dir / "trajectories.jsonl").open("w") as f:
        for result in results:
            for episode in result.episodes:
                f.write(json.dumps(trajectory_line(result, episode, settings)) + "\n")


def print_table(summary: dict[str, Any]) -> None:
    """The summary as a rich table on stdout (whole when piped to a file too)."""
    from rich.table import Table

    from env_server.tables import print_whole

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    low, high = summary["accuracy_ci95"]
    failed = summary["failed_problems"]
    table = Table(title=f"mathdebate eval: {summary['strategy']} (n={summary['n']}), {summary['mode']} mode, "
                        f"{summary['n_problems']} problems" + (f", {failed} failed (not scored)" if failed else ""))
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("problems scored", f"{summary['scored_problems']} of {summary['n_problems']}"),
        ("accuracy (95% CI, scored)", f"{pct(summary['accuracy'])} [{pct(low)}, {pct(high)}]"),
        ("first-answer accuracy", pct(summary["first_answer_accuracy"])),
        ("judge accuracy", pct(summary["judge_accuracy"])),
    ]
    if summary["pass_at_n"] is not None:
        rows += [(f"pass@{summary['n']}", pct(summary["pass_at_n"])), ("sample accuracy", pct(summary["sample_accuracy"]))]
    rows += [(f"reward/{role}", f"{v['reward']:.3f} ({v['turns']} turns)") for role, v in summary["per_role"].items()]
    rows += [("error kinds", ", ".join(f"{k} {v}" for k, v in sorted(summary["error_kinds"].items())) or "-"),
             ("forfeits (the model's own)", ", ".join(f"{k} {v}" for k, v in sorted(summary["forfeits"].items())) or "-"),
             ("mean turns", "-" if summary["mean_turns"] is None else f"{summary['mean_turns']:.2f}")]
    for spec, r in summary["requests"].items():
        rows.append((f"tokens {spec}", f"{r['prompt_tokens']} in / {r['completion_tokens']} out"
                                       + (f", cost {r['cost']:.4f}" if r["cost"] else "")))
    requests = summary["failures"]["requests"]
    rows += [("requests failed", f"{requests['failed']} of {requests['requests']}"),
             ("episodes failed", f"{summary['episodes_failed']} of {summary['episodes']}")]
    rows += [(f"failed: {kind}", f"{v['count']}: {v['example']}") for kind, v in summary["failures"]["reasons"].items()]
    rows += [("seconds", f"{summary['seconds']:.1f}")]
    for name, value in rows:
        table.add_row(name, value)
    print_whole(table)
