"""Aggregates of an evaluation run: ``results.json``, ``trajectories.jsonl`` and the table.

``results.json`` (one object):

- ``accuracy``: share of problems whose chosen episode is right (``episode_reward == 1``);
  ``accuracy_ci95``: its 95% Wilson score interval (``scipy.stats.binomtest``);
- ``n_problems``, ``mode``, ``strategy``, ``n``, ``temperature``, ``select``, ``policies`` (spec
  per role);
- ``first_answer_accuracy`` (the chosen episode's first solver answer), ``judge_accuracy``
  (among chosen debates whose judge boxed an answer; ``null`` in single mode), ``pass_at_n``
  and ``sample_accuracy`` (all episodes) for N > 1, ``mean_votes`` for self-consistency;
- ``per_role``: per role, ``reward`` (mean per-turn reward over the chosen episodes' turns) and
  ``turns``; ``error_kinds`` (markers over the chosen episodes' turns); ``mean_turns``;
- ``tokens`` and ``requests`` per policy (prompt/completion tokens, requests, failed, cost in the
  currency of ``--cost-per-million``), ``requests_failed``, ``actions_rejected``,
  ``episodes_failed``, ``episodes``, ``scoring_episodes``, ``seconds``;
- ``provenance``: the commit, library versions, the command's arguments and their hash, the
  env server and its problem source, the machine (:mod:`env_server.provenance`).

``trajectories.jsonl``: one line per played episode, in the server's ``--trajectory-log`` line
schema (``episode_id``, ``problem_id``, ``turns`` with ``t``/``role``/``round``/``content``,
``rewards``: the record) plus ``problem``, ``gold``, ``mode``, ``strategy``, ``sample``,
``chosen``, ``score``/``score_source`` and, per turn, ``policy``, ``messages`` (what the policy
was given), ``generated`` (its raw output when that differs from the action), token counts,
``accept_prob`` and ``forfeit``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.evaluation.policies import Policy
from trainer_client.evaluation.runner import EvalSettings, PlayedEpisode, ProblemResult

__all__ = ["print_table", "summarise", "trajectory_line", "wilson_interval", "write_outputs"]


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
              counters: dict[str, int], seconds: float, cost_per_million: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    """The ``results.json`` object (see the module docstring)."""
    n = len(results)
    chosen = [r.chosen_episode for r in results]
    correct = sum(r.correct for r in results)
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
    per_policy: dict[str, dict[str, Any]] = {}
    for policy in {id(p): p for p in policies.values()}.values():
        c = policy.counters
        cost = (c["prompt_tokens"] * cost_per_million[0] + c["completion_tokens"] * cost_per_million[1]) / 1e6
        per_policy[policy.spec] = {"requests": c["requests"], "failed": c["failed"],
                                   "prompt_tokens": c["prompt_tokens"], "completion_tokens": c["completion_tokens"],
                                   "cost": round(cost, 6)}
    summary: dict[str, Any] = {
        "accuracy": correct / n if n else 0.0,
        "accuracy_ci95": [low, high],
        "n_problems": n,
        "mode": settings.mode,
        "strategy": settings.strategy,
        "n": 1 if settings.strategy == "greedy" else settings.n,
        "temperature": settings.temperature,
        "select": settings.select if settings.strategy == "best_of_n" else None,
        "policies": {role.value: policy.spec for role, policy in policies.items()},
        "first_answer_accuracy": _mean([float(rec.facts.first_answer_correct) for rec in records]) or 0.0,
        "judge_accuracy": _mean([float(j) for j in judged]),
        "pass_at_n": _mean([float(r.pass_at_n) for r in results]) if settings.strategy != "greedy" else None,
        "sample_accuracy": _mean([float(e.correct) for e in all_episodes]) if settings.strategy != "greedy" else None,
        "mean_votes": (_mean([float(r.votes or 0) for r in results]) if settings.strategy == "self_consistency"
                       else None),
        "per_role": {role: {"reward": _mean(values), "turns": len(values)} for role, values in role_rewards.items()
                     if values},
        "error_kinds": dict(error_kinds),
        "mean_turns": _mean([float(len(e.turns)) for e in chosen]) or 0.0,
        "tokens": {spec: {k: v for k, v in c.items() if k.endswith("tokens")} for spec, c in per_policy.items()},
        "requests": per_policy,
        "requests_failed": counters.get("requests_failed", 0),
        "actions_rejected": counters.get("actions_rejected", 0),
        "episodes": len(all_episodes),
        "episodes_failed": counters.get("episodes_failed", 0),
        "scoring_episodes": counters.get("scoring_episodes", 0),
        "seconds": round(seconds, 2),
    }
    return summary


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
        "error": episode.error,
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
    """The summary as a rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    low, high = summary["accuracy_ci95"]
    table = Table(title=f"mathdebate eval: {summary['strategy']} (n={summary['n']}), {summary['mode']} mode, "
                        f"{summary['n_problems']} problems")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("accuracy (95% CI)", f"{pct(summary['accuracy'])} [{pct(low)}, {pct(high)}]"),
        ("first-answer accuracy", pct(summary["first_answer_accuracy"])),
        ("judge accuracy", pct(summary["judge_accuracy"])),
    ]
    if summary["pass_at_n"] is not None:
        rows += [(f"pass@{summary['n']}", pct(summary["pass_at_n"])), ("sample accuracy", pct(summary["sample_accuracy"]))]
    rows += [(f"reward/{role}", f"{v['reward']:.3f} ({v['turns']} turns)") for role, v in summary["per_role"].items()]
    rows += [("error kinds", ", ".join(f"{k} {v}" for k, v in sorted(summary["error_kinds"].items())) or "-"),
             ("mean turns", f"{summary['mean_turns']:.2f}")]
    for spec, r in summary["requests"].items():
        rows.append((f"tokens {spec}", f"{r['prompt_tokens']} in / {r['completion_tokens']} out"
                                       + (f", cost {r['cost']:.4f}" if r["cost"] else "")))
    rows += [("requests failed", str(summary["requests_failed"])), ("episodes failed", str(summary["episodes_failed"])),
             ("seconds", f"{summary['seconds']:.1f}")]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
