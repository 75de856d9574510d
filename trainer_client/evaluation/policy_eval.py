"""Every figure of one policy on one set of problems, from one call: what ``ablate`` reports
before and after training.

On the same problems, in the episode mode the policy trains in:

- ``accuracy``: greedy first-answer accuracy (:func:`~trainer_client.evaluation.heldout.evaluate_first_answers`);
- ``sampled_accuracy``: first-answer accuracy averaged over ``k`` samples per problem at the
  run's training temperature (avg@k, as Dr.MAS and AT-GRPO report it);
- ``pass_at_k``: share of problems with a right answer among those ``k`` samples;
- ``final_accuracy``: the debate's final answer (the episode reward ``G``), greedy whole debates
  (:func:`~trainer_client.evaluation.episode_eval.evaluate_episodes`); in ``single`` mode the first answer;
- ``sampled_final_accuracy``: the same over ``debate_k`` sampled debates per problem;
- the debate's own figures (greedy and sampled): the verifier's balanced verdict accuracy, how
  often the judge copies the solver, and how often the debate turns a wrong first answer right
  or a right one wrong.

Each accuracy also comes per problem (``(N,)`` floats, a mean over samples where sampled), so
that gains are paired on problems and seeds (:mod:`trainer_client.ablation.stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ACCURACY_METRICS", "PolicyEvaluation", "evaluate_policy"]

#: The accuracies reported before and after training, each with a per-problem vector.
ACCURACY_METRICS = ("accuracy", "sampled_accuracy", "pass_at_k", "final_accuracy", "sampled_final_accuracy")


@dataclass
class PolicyEvaluation:
    """One policy's figures (:func:`evaluate_policy`).

    Attributes:
        figures: aggregates (fractions; ``None`` where not measured, e.g. the sampled ones with
            ``k == 0``): :data:`ACCURACY_METRICS`, ``valid_rate``, ``accuracy_valid``,
            ``sample_valid_rate``, ``episode_reward`` (= ``final_accuracy``), ``finished_rate``,
            ``judge_accuracy``, ``balanced_verdict_accuracy``, ``verdict_accuracy_right``,
            ``verdict_accuracy_wrong``, ``judge_copies_solver``, ``wrong_to_right``,
            ``right_to_wrong``, ``missing_verdict_share``, ``net_repair_rate``,
            ``repair_when_rejected``, ``repair_when_accepted`` and their ``sampled_`` twins, ``k``, ``debate_k``,
            ``temperature``, ``seconds``; the inference tokens (generated, means): ``first_answer_tokens``
            (a greedy first answer), ``sample_tokens`` (a sampled first answer), ``debate_tokens`` (a
            greedy episode, every turn; in ``single`` mode the one answer); and
            ``majority_accuracy_by_k`` (the majority vote over the first ``m`` samples, ``m = 1..k``).
        per_problem: ``{metric: (N,) floats}`` for the measured :data:`ACCURACY_METRICS`.
    """

    figures: dict[str, Any]
    per_problem: dict[str, list[float]] = field(default_factory=dict)

    @property
    def correct(self) -> list[bool]:
        """``(N,)`` greedy first-answer correctness."""
        return [bool(x) for x in self.per_problem["accuracy"]]


_DEBATE_KEYS = ("balanced_verdict_accuracy", "verdict_accuracy_right", "verdict_accuracy_wrong", "judge_copies_solver",
                "wrong_to_right", "right_to_wrong", "finished_rate", "judge_accuracy", "missing_verdict_share",
                "net_repair_rate", "repair_when_rejected", "repair_when_accepted")


def evaluate_policy(model: Any, tokenizer: Any, source: Any, seeds: Sequence[int], *, k: int, temperature: float,
                    debate_k: int | None = None, max_rounds: int = 1, mode: str = "debate",
                    play_as: Callable[[Any], AbstractContextManager[Any]] | None = None,
                    sample_seed: int = 0, max_new_tokens: int = 96, batch_size: int = 64,
                    progress: bool | None = None) -> PolicyEvaluation:
    """Evaluate a policy on ``source.by_seed(s)`` for ``s`` in ``seeds``.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (chat template with tools).
        source, seeds: the problems.
        k: samples per problem for ``sampled_accuracy`` and ``pass_at_k`` (0: greedy only).
        temperature: the samples' temperature (the run's training temperature).
        debate_k: sampled debates per problem for ``sampled_final_accuracy`` (default ``k``; 0: none).
        max_rounds: the debates' rounds.
        mode: ``debate`` or ``single``.
        play_as: per-role policies (:func:`~trainer_client.evaluation.episode_eval.evaluate_episodes`);
            the first answers are the solver's.
        sample_seed: torch seed of the samples.
        max_new_tokens: longest generated turn (first answers and every debate turn).
        batch_size: prompts (or debates) per generation batch.
        progress: the first answers' progress bar (``None``: on a terminal only).

    Returns:
        :class:`PolicyEvaluation`.
    """
    from env_server.protocol.markers import Role
    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.evaluation.heldout import evaluate_first_answers

    debate_k = k if debate_k is None else debate_k
    with nullcontext() if play_as is None else play_as(Role.SOLVER):
        first = evaluate_first_answers(model, tokenizer, source, seeds, k=k, temperature=temperature,
                                       max_rounds=max_rounds, mode=mode, sample_seed=sample_seed,
                                       max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress)
    greedy = evaluate_episodes(model, tokenizer, source, seeds, max_rounds=max_rounds, mode=mode, play_as=play_as,
                               max_new_tokens=max_new_tokens, batch_size=batch_size)
    sampled = (evaluate_episodes(model, tokenizer, source, seeds, max_rounds=max_rounds, mode=mode, play_as=play_as,
                                 k=debate_k, temperature=temperature, sample_seed=sample_seed,
                                 max_new_tokens=max_new_tokens, batch_size=batch_size)
               if debate_k else None)
    figures: dict[str, Any] = {
        "n": first.n, "k": k, "debate_k": debate_k, "temperature": temperature,
        "accuracy": first.accuracy, "valid_rate": first.valid_rate, "accuracy_valid": first.accuracy_valid,
        "sampled_accuracy": first.sample_accuracy, "sample_valid_rate": first.sample_valid_rate,
        "pass_at_k": first.pass_at_k,
        "final_accuracy": greedy.episode_reward, "episode_reward": greedy.episode_reward,
        "sampled_final_accuracy": sampled.episode_reward if sampled else None,
        "seconds": first.seconds + greedy.seconds + (sampled.seconds if sampled else 0.0),
        "first_answer_tokens": first.mean_tokens, "sample_tokens": first.mean_sample_tokens,
        "debate_tokens": greedy.mean_tokens, "majority_accuracy_by_k": first.majority_accuracy_by_k,
    }
    for key in _DEBATE_KEYS:
        figures[key] = getattr(greedy, key)
        figures[f"sampled_{key}"] = getattr(sampled, key) if sampled else None
    per_problem: dict[str, list[float]] = {
        "accuracy": [float(r.correct) for r in first.records],
        "final_accuracy": greedy.per_problem_final(),
    }
    if k:
        per_problem["sampled_accuracy"] = [sum(r.sample_correct) / len(r.sample_correct) for r in first.records]
        per_problem["pass_at_k"] = [float(any(r.sample_correct)) for r in first.records]
    if sampled:
        per_problem["sampled_final_accuracy"] = sampled.per_problem_final()
    return PolicyEvaluation(figures, per_problem)
