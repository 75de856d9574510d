"""Evaluation during training (``eval_steps``): the policy being trained, on a fixed set of
validation problems, every ``eval_steps`` steps, logged through TRL's logging as ``eval/...``.

What is measured is what ``mathdebate ablate`` reports before and after training, from the same
code (:func:`~trainer_client.evaluation.policy_eval.evaluate_policy`), on the *validation* split
(seeds ``VALIDATION_SEED_BASE + i``, :mod:`env_server.debate.problems.splits`; never the held-out
problems results are reported on):

==================================  ==========================================================
``eval/first_answer_accuracy``      greedy first answer right (a well-formed ``submit_solution``)
``eval/sampled_accuracy``           the first answer, avg@k over ``eval.k`` samples per problem
``eval/pass_at_k``                  a right answer among those ``k`` samples
``eval/final_accuracy``             the greedy debate's final answer (the episode reward ``G``)
``eval/sampled_final_accuracy``     the same over ``eval.debate_k`` sampled debates per problem
``eval/valid_rate``                 greedy first turns that are a valid ``submit_solution`` call
``eval/balanced_verdict_accuracy``  the verifier's verdicts, balanced over right and wrong answers
``eval/verdict_accuracy_right``     ... accepting right answers; ``_wrong``: rejecting wrong ones
``eval/judge_copies_solver``        the judge's answer is the solver's last one
``eval/wrong_to_right``             first answer wrong, final right (over all debates)
``eval/right_to_wrong``             first answer right, final wrong
``eval/missing_verdict_share``      verifier turns with no parsable verdict
``eval/net_repair_rate``            (wrong→right − right→wrong) ÷ wrong first answers
``eval/problems``                   validation problems evaluated (``eval.problems``)
``eval/seconds``                    wall-clock of the evaluation
==================================  ==========================================================

(a figure that cannot be measured, e.g. a verdict accuracy with no wrong answer reviewed, is left
out of that evaluation's line rather than logged as a number.)

The training it runs between does not change: the model's train/eval mode, the torch CPU and
CUDA generators, Python's and NumPy's generators are all as they were after it, so the trained
weights are bit-identical with the evaluation on or off (tested).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from env_server.debate.problems import ProblemSource
from env_server.debate.problems.splits import VALIDATION_SEED_BASE

__all__ = ["EVAL_PREFIX", "ValidationEvaluation", "validation_seeds"]

log = logging.getLogger(__name__)

#: Every metric of the evaluation during training starts with this.
EVAL_PREFIX = "eval/"

#: ``evaluate_policy`` figure -> logged metric.
_LOGGED = {
    "accuracy": "first_answer_accuracy",
    "sampled_accuracy": "sampled_accuracy",
    "pass_at_k": "pass_at_k",
    "final_accuracy": "final_accuracy",
    "sampled_final_accuracy": "sampled_final_accuracy",
    "valid_rate": "valid_rate",
    "balanced_verdict_accuracy": "balanced_verdict_accuracy",
    "verdict_accuracy_right": "verdict_accuracy_right",
    "verdict_accuracy_wrong": "verdict_accuracy_wrong",
    "judge_copies_solver": "judge_copies_solver",
    "wrong_to_right": "wrong_to_right",
    "right_to_wrong": "right_to_wrong",
    "missing_verdict_share": "missing_verdict_share",
    "net_repair_rate": "net_repair_rate",
    "n": "problems",
    "seconds": "seconds",
}


def validation_seeds(n: int) -> list[int]:
    """``(n,)`` the validation split's first ``n`` seeds: ``VALIDATION_SEED_BASE + i``."""
    return [VALIDATION_SEED_BASE + i for i in range(n)]


class ValidationEvaluation:
    """The evaluation run every ``eval_steps`` (a callable the trainer calls; see the module docstring).

    Args:
        source: the run's problem source (``problems``: what the server serves).
        problems: how many validation problems (``VALIDATION_SEED_BASE .. + problems - 1``).
        k, debate_k, temperature, max_new_tokens, max_rounds, batch_size, sample_seed: as
            :func:`~trainer_client.evaluation.policy_eval.evaluate_policy` takes them.
        mode: the run's episode mode (``debate`` or ``single``): the prompts are that mode's.
        play_as: ``play_as(model, role)`` makes ``role``'s policy the model's (per-role
            adapters, :func:`~trainer_client.policies.adapters.use_route`); ``None``: one policy.
    """

    def __init__(self, source: ProblemSource, problems: int, *, k: int, debate_k: int, temperature: float,
                 max_new_tokens: int, max_rounds: int, batch_size: int, mode: str, sample_seed: int = 0,
                 play_as: Callable[[Any, Any], AbstractContextManager[Any]] | None = None) -> None:
        self.source, self.seeds = source, validation_seeds(problems)
        self.options: dict[str, Any] = {"k": k, "debate_k": debate_k, "temperature": temperature,
                                        "max_new_tokens": max_new_tokens, "max_rounds": max_rounds,
                                        "batch_size": batch_size, "mode": mode, "sample_seed": sample_seed}
        self.play_as = play_as

    @classmethod
    def from_config(cls, config: Any, play_as: Callable[[Any, Any], AbstractContextManager[Any]] | None = None
                    ) -> ValidationEvaluation:
        """The evaluation a :class:`~trainer_client.config.TrainConfig`'s ``eval`` section asks for.

        Raises:
            FileNotFoundError, ValueError: ``config.problems`` does not load.
        """
        from env_server.debate.problems import load_problem_source

        settings = config.eval
        max_rounds = settings.max_rounds or config.max_rounds
        if max_rounds is None:
            log.info("evaluation during training: the run leaves max_rounds to the server; the validation debates "
                     "play 1 round (set max_rounds or eval.max_rounds)")
        return cls(load_problem_source(config.problems), settings.problems, k=settings.k, debate_k=settings.debate_k,
                   temperature=settings.temperature or config.temperature,
                   max_new_tokens=settings.max_new_tokens or config.max_completion_length,
                   max_rounds=max_rounds or 1, batch_size=settings.batch_size, mode=config.mode,
                   sample_seed=settings.sample_seed, play_as=play_as)

    def __call__(self, model: Any, tokenizer: Any) -> dict[str, float]:
        """Evaluate ``model`` (the unwrapped policy being trained) and return the ``eval/...`` metrics.

        Every generator the training draws from is restored afterwards (torch's CPU generator
        and, on CUDA, the current device's; Python's ``random``; NumPy's global one), and the
        model's train/eval mode is as it was.
        """
        import numpy as np
        import torch

        from trainer_client.evaluation.policy_eval import evaluate_policy

        route = self.play_as
        play_as = None if route is None else (lambda role: route(model, role))
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=devices):
                figures = evaluate_policy(model, tokenizer, self.source, self.seeds, play_as=play_as, progress=False,
                                          **self.options).figures
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
        return {EVAL_PREFIX + name: float(figures[key]) for key, name in _LOGGED.items()
                if figures.get(key) is not None}
