"""Debate training against single-agent training, at equal inference tokens (issue 55).

A debate arm (``mode: debate``) and its single-agent twin (the same preset and credit, ``mode:
single``; arm names ``X`` and ``X+single``) are paired by seed. The debate is judged by its final
answer (greedy whole debates); the single-trained solver by the better of its greedy first answer
and its **majority vote at equal inference tokens**: over the first ``k`` of its sampled answers,
``k = ⌊debate tokens / sample tokens⌋`` (the debate's mean generated tokens per greedy episode
over the single solver's mean per sampled answer, both on the same evaluation problems), at
least 1 and at most the samples drawn (the cap is reported). Majority vote explains much of what
debate gains (arXiv 2508.17536), so a debate earns its place only above it.

Training compute is compared as the sampled tokens (``tokens/sampled`` summed over each run's
steps, branch generations included): the pair is labelled equal-tokens when the single arm's
total is within :data:`EQUAL_TOKENS_TOLERANCE` of the debate arm's on every seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["EFFECT_NAME", "EQUAL_TOKENS_TOLERANCE", "debate_vs_single", "equal_token_votes"]

#: Relative difference of sampled training tokens under which two runs count as equal compute.
EQUAL_TOKENS_TOLERANCE = 0.05
#: The effect's name in ``summary.json``'s ``effects`` (a pair other than ``baseline``'s is named in brackets).
EFFECT_NAME = "debate - single (equal tokens)"


def equal_token_votes(debate_tokens: float | None, sample_tokens: float | None, drawn: int) -> tuple[int, bool]:
    """``(k, capped)``: how many sampled answers fit in a debate's inference tokens,
    ``⌊debate_tokens / sample_tokens⌋`` clamped to ``[1, drawn]``, and whether ``drawn`` capped it.

    Raises:
        ValueError: a token figure missing or not positive, or ``drawn < 1``.
    """
    if drawn < 1:
        raise ValueError("the majority vote needs at least one sampled answer (ablate --pass-k)")
    if not debate_tokens or not sample_tokens or debate_tokens <= 0 or sample_tokens <= 0:
        raise ValueError(f"inference tokens not measured (debate {debate_tokens}, sample {sample_tokens})")
    fit = max(1, math.floor(debate_tokens / sample_tokens))
    return min(fit, drawn), fit > drawn


def _sampled_tokens(run: Any) -> float:
    return float(sum(line.get("tokens/sampled", 0.0) for line in run.curve))


def debate_vs_single(arms: Mapping[str, Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """Every debate arm with a single-mode twin, compared seed by seed (module docstring).

    Args:
        arms: arm name -> its :class:`~trainer_client.ablation.runs.RunResult` per seed.

    Returns:
        ``{debate arm name: figures}``, figures with per-seed lists over the paired ``seeds``:
        ``k`` (the votes at equal inference tokens) and ``k_capped``, ``debate_tokens`` and
        ``sample_tokens`` (mean generated tokens), ``debate_final_accuracy``,
        ``single_accuracy`` (greedy first answer), ``single_majority_accuracy`` (at ``k``),
        ``tokens_sampled`` (``[debate, single]`` per seed) and ``equal_tokens``; and the effect
        ``debate final − max(single greedy, single majority)`` with its seed-level 95% t
        interval (``mean``, ``by_seed_ci95``), beside ``vs_greedy`` and ``vs_majority`` alone.
        Pairs without a common seed, or whose runs lack the token figures, are left out.
    """
    from trainer_client.ablation.stats import mean_interval

    out: dict[str, dict[str, Any]] = {}
    for name, debate_runs in arms.items():
        twin = {run.seed: run for run in arms.get(f"{name}+single", ())}
        pairs = [(run, twin[run.seed]) for run in debate_runs if run.mode == "debate" and run.seed in twin]
        if not pairs:
            continue
        rows = []
        try:
            for debate, single in pairs:
                votes = single.heldout.get("majority_accuracy_by_k") or []
                k, capped = equal_token_votes(debate.heldout.get("debate_tokens"), single.heldout.get("sample_tokens"),
                                              len(votes))
                rows.append((debate, single, k, capped, votes[k - 1]))
        except ValueError:
            continue
        final = [float(d.heldout.get("final_accuracy", d.heldout.get("episode_reward"))) for d, *_ in rows]
        greedy = [float(s.heldout["accuracy"]) for _, s, *_ in rows]
        majority = [float(v) for *_, v in rows]
        tokens = [[_sampled_tokens(d), _sampled_tokens(s)] for d, s, *_ in rows]

        def effect(values: list[float]) -> dict[str, Any]:
            interval = mean_interval(values)
            return {"mean": interval.mean, "by_seed_ci95": [interval.low, interval.high], "by_seed": values}

        out[name] = {
            "seeds": [d.seed for d, *_ in rows],
            "k": [k for *_, k, _, _ in rows], "k_capped": [c for *_, c, _ in rows],
            "debate_tokens": [float(d.heldout["debate_tokens"]) for d, *_ in rows],
            "sample_tokens": [float(s.heldout["sample_tokens"]) for _, s, *_ in rows],
            "debate_final_accuracy": final, "single_accuracy": greedy, "single_majority_accuracy": majority,
            "tokens_sampled": tokens,
            "equal_tokens": all(abs(s - d) <= EQUAL_TOKENS_TOLERANCE * d for d, s in tokens),
            **effect([f - max(g, m) for f, g, m in zip(final, greedy, majority, strict=True)]),
            "vs_greedy": effect([f - g for f, g in zip(final, greedy, strict=True)]),
            "vs_majority": effect([f - m for f, m in zip(final, majority, strict=True)]),
        }
    return out
