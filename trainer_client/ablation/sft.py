"""Supervised fine-tuning on gold debates: the SFT control of ``mathdebate ablate``.

The control answers "would plain supervised learning on the same problems, for the same
wall-clock, do as well as RL?". Its data are gold debates of the RL training problems (the
solver's turn is the reference solution, worked steps included; the verifier and judge turns as
in the warm-up), laid out token for token as TRL's tool loop lays out a rollout
(:func:`trainer_client.tiny_models.build.rollout_tokens`), with the loss on the model's own tokens only.
It is gold-supervised by construction.

Written here rather than with TRL's ``SFTTrainer`` because the budget is wall-clock (stop when
``seconds`` have passed, to match an RL run) and the examples are already tokenised with their
loss masks; the loop is the warm-up's (:func:`trainer_client.tiny_models.build.supervised_steps`).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["gold_debate_family", "supervised_fine_tune"]

log = logging.getLogger(__name__)


def gold_debate_family(problems: str | None) -> str | None:
    """The generator family of a ``gen:<family>`` problem spec, or ``None`` for any other source
    (the gold debates are generated from a family)."""
    if problems and problems.startswith("gen:") and "," not in problems:
        return problems[4:].strip()
    return None


def supervised_fine_tune(model: Any, tokenizer: Any, problems: str | None, first_seed: int, n_debates: int, *,
                         seconds: float, seed: int = 0, learning_rate: float = 1e-3, batch_size: int = 8) -> int:
    """Fine-tune ``model`` in place on gold debates of the problems with seeds
    ``first_seed .. first_seed + n_debates - 1`` for ``seconds``.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (chat template with tools).
        problems: the problem spec; must be ``gen:<family>`` (one family).
        first_seed, n_debates: the problem seeds (an RL run's training seeds are
            ``config.seed + i``, ``i < dataset_size``).
        seconds: wall-clock budget of the optimisation (data preparation not counted).
        seed: sampling seed of the mini-batches.
        learning_rate: AdamW learning rate (constant).
        batch_size: debates per step.

    Returns:
        The number of optimiser steps taken.

    Raises:
        ValueError: ``problems`` is not a single-family ``gen:`` spec.
    """
    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.tiny_models.build import rollout_tokens, supervised_steps
    from trainer_client.tiny_models.warmup_debates import synthetic_debates

    family = gold_debate_family(problems)
    if family is None:
        raise ValueError(f"the SFT control needs a one-family generator source (gen:<family>), got {problems!r}")
    conversations = synthetic_debates(n_debates, seed, family=family, answer_accuracy=1.0, seed_base=first_seed,
                                      worked=True)  # the learning warm-up's format: worked solutions
    tools = tool_callables()
    examples = [rollout_tokens(tokenizer, c, tools) for c in conversations]
    steps = supervised_steps(model, examples, tokenizer.pad_token_id, learning_rate=learning_rate,
                             batch_size=batch_size, seed=seed, seconds=seconds)
    log.info("SFT control: %d steps in %.0f s on %d gold debates", steps, seconds, len(examples))
    return steps
