"""Choosing one of N samples: best-of-N by score, self-consistency by majority vote.

Self-consistency (X. Wang et al., "Self-Consistency Improves Chain of Thought Reasoning in
Language Models", ICLR 2023): sample N reasoning paths and return the most frequent final
answer. Frequency needs answer equality, and the server's grader is not an equivalence
relation (its first argument is the gold answer, tolerances apply, ``grade(a, b)`` may differ
from ``grade(b, a)``). The rule here: go through the samples in order; a sample joins the first
cluster whose *first member*, taken as gold, grades it correct; else it opens a new cluster.
So ``\\frac12`` and ``0.5`` vote together whichever comes first when the grader accepts each
against the other's form. The largest cluster wins; ties go to the cluster whose first member
came first; the chosen sample is that cluster's first member. Samples without an answer do not
vote (and win nothing) unless no sample has one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["best_of_n_choice", "self_consistency_choice", "self_consistency_clusters"]


def best_of_n_choice(scores: Sequence[float | None]) -> int:
    """Index of the highest score; ties go to the lowest index; ``None`` scores rank below
    every number (all ``None``: index 0).

    Raises:
        ValueError: no scores.
    """
    if not scores:
        raise ValueError("best-of-N needs at least one sample")
    best, best_score = 0, scores[0]
    for i, score in enumerate(scores):
        if score is not None and (best_score is None or score > best_score):
            best, best_score = i, score
    return best


def self_consistency_clusters(answers: Sequence[str | None], same: Callable[[str, str], bool]) -> list[list[int]]:
    """Greedy clusters of sample indices (see the module docstring), in order of first member.

    Args:
        answers: each sample's final answer (``None``: no answer; it is left out).
        same: ``same(gold, answer)``: the grader's verdict with the first argument as gold.
    """
    clusters: list[list[int]] = []
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        for cluster in clusters:
            head = answers[cluster[0]]
            assert head is not None
            if same(head, answer):
                cluster.append(i)
                break
        else:
            clusters.append([i])
    return clusters


def self_consistency_choice(answers: Sequence[str | None], same: Callable[[str, str], bool]) -> tuple[int, int]:
    """``(chosen sample index, votes)``: the first member of the largest cluster (ties: the
    earliest cluster); ``(0, 0)`` when no sample has an answer.

    Raises:
        ValueError: no samples.
    """
    if not answers:
        raise ValueError("self-consistency needs at least one sample")
    clusters = self_consistency_clusters(answers, same)
    if not clusters:
        return 0, 0
    best = max(clusters, key=len)  # max keeps the first of equal lengths: the earliest cluster
    return best[0], len(best)
